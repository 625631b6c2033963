"""The paper's comparison at CPU scale now lives in the package (mas_lab/study/); this keeps the
commands of the notebook and of earlier sessions working: the same options, the same runs.

    .venv/bin/python benchmarks/reproduce.py ...   ==   .venv/bin/python -m mas_lab.study.reproduce ...
"""

from mas_lab.study.reproduce import main

if __name__ == "__main__":
    main()
