"""Studies: many runs of regimes x seeds, run one at a time and resumably, kept in the repository,
compared and reported. The paper's comparison at CPU scale is the first (`make reproduce`,
`python -m mas_lab.study.reproduce`)."""
