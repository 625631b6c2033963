"""Study files go through the task files' guards (mas_lab/config.py read_yaml_file): one line
naming the file, exit 2, never a traceback or a silent guess."""

from pathlib import Path

import pytest
from conftest import ROOT

from mas_lab.study.spec import StudyFileError, load_study

GOOD = (ROOT / "studies" / "paper.yaml").read_text()


def _study(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "text, said",
    [
        ("a: " + "[" * 20000 + "]" * 20000, "nested too deeply"),
        ("name: x\nseeds: [true]\n", "seeds.0"),
        ("name: x\nseeds: [0]\nseeds: [1]\n", "key 'seeds' appears twice"),
        ("name: " + "x" * 500_000 + "\n", "name"),
        ("name: x\nseeds: [\n", "s.yaml, line 3, column 1: not valid YAML"),
    ],
    ids=["deep nesting", "a boolean seed", "a duplicate key", "a huge name", "a syntax error"],
)
def test_a_hostile_study_file_is_refused_in_one_line_naming_the_file(tmp_path, text, said):
    with pytest.raises(StudyFileError) as caught:
        load_study(_study(tmp_path, text), ROOT)
    message = str(caught.value)
    assert said in message and str(tmp_path / "s.yaml") in message and "\n" not in message[:300]
    assert "<unicode string>" not in message


def test_a_study_file_over_the_size_limit_is_refused_before_parsing(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("# " + "x" * (2 << 20))
    with pytest.raises(StudyFileError, match="bytes; a study file is at most"):
        load_study(path, ROOT)


def test_a_report_target_that_is_a_folder_is_refused_when_the_study_loads(tmp_path):
    (tmp_path / "folder.md").mkdir()
    text = GOOD.replace("results_md: docs/results/paper.md", f"results_md: {tmp_path / 'folder.md'}")
    assert text != GOOD
    with pytest.raises(StudyFileError, match="report.results_md: .* is a folder"):
        load_study(_study(tmp_path, text), ROOT)


def test_a_task_file_syntax_error_names_the_file_line_and_column(tmp_path):
    from mas_lab.config import TaskFileError, load_task

    path = tmp_path / "t.yaml"
    path.write_text("name: x\nenv: [\n")
    with pytest.raises(TaskFileError, match=r"t.yaml, line 3, column 1: not valid YAML"):
        load_task(path)


def test_a_regime_runs_only_on_the_tasks_it_names(tmp_path):
    """The single agent with the tool exists only where the task has a tool: `tasks:` limits a
    regime to those keys; a key that is not a task is refused naming the regime."""
    families = {f.key: f for f in load_study(ROOT / "studies" / "paper.yaml", ROOT)}
    assert "single agent + GRPO with the tool" in families["plan_path_tool"].names
    assert (
        families["plan_path_tool"].regimes["single agent + GRPO with the tool"][0]
        == "tasks/plan_path_tool_single_tool.yaml"
    )
    assert "single agent + GRPO with the tool" not in families["sokoban"].names
    text = GOOD.replace("tasks: [plan_path_tool, plan_path_paper]", "tasks: [plan_path_tools]")
    assert text != GOOD
    with pytest.raises(
        StudyFileError, match=r"\(single agent \+ GRPO with the tool\).tasks: \['plan_path_tools'\] are not tasks"
    ):
        load_study(_study(tmp_path, text), ROOT)


def test_a_task_can_add_overrides_to_one_regime_and_a_wrong_one_is_refused(tmp_path):
    """plan_path_paper's planner has its own K 8, which trajectories cannot take: the task's `set`
    gives that regime K 8 whole episodes there, and leaves the regime on other tasks as it was."""
    families = {f.key: f for f in load_study(ROOT / "studies" / "paper.yaml", ROOT)}
    assert families["plan_path_paper"].regimes["MAS + trajectory GRPO"] == (
        "tasks/plan_path_paper.yaml",
        ["algorithm.mode=trajectories", "roles.1.k=null", "algorithm.k=8"],
    )
    assert families["plan_path_tool"].regimes["MAS + trajectory GRPO"][1] == ["algorithm.mode=trajectories"]
    without = GOOD.replace("      MAS + trajectory GRPO: [roles.1.k=null, algorithm.k=8]\n", "      {}\n")
    assert without != GOOD
    with pytest.raises(StudyFileError, match=r"x regimes\[2\] \(MAS \+ trajectory GRPO\).*roles.1.k"):
        load_study(_study(tmp_path, without), ROOT)
    unknown = GOOD.replace("      MAS + trajectory GRPO: [roles", "      MAS + trajectory GRPOs: [roles")
    with pytest.raises(StudyFileError, match=r"set: 'MAS \+ trajectory GRPOs' is not a regime"):
        load_study(_study(tmp_path, unknown), ROOT)
    bad = GOOD.replace("[roles.1.k=null, algorithm.k=8]", "[k8]")
    with pytest.raises(StudyFileError, match="'k8': expected key.path=value"):
        load_study(_study(tmp_path, bad), ROOT)


@pytest.mark.parametrize("study", sorted(p.name for p in (ROOT / "studies").glob("*.yaml")))
def test_every_shipped_study_file_loads_with_every_task_resolved(study):
    """A shipped study names task files and overrides that must all resolve (load_study loads every
    task x regime): a prepared study that was never run still has to be runnable."""
    families = load_study(ROOT / "studies" / study, ROOT)
    assert families and all(f.regime_list for f in families)


def test_the_report_names_each_roles_own_k_where_the_team_has_one():
    """plan_path_paper's tool samples 4 and its planner 8: the budget line names both (and K 8, the
    largest group), not the algorithm's default 4; a task without a role's own K reads as before."""
    from mas_lab.study.report import budget

    families = {f.key: f for f in load_study(ROOT / "studies" / "paper.yaml", ROOT)}
    assert "x K = 8 (tool 4, planner 8 in the team's tree) after" in budget(families["plan_path_paper"])
    assert "40 steps x 8 problems x K = 4 after 20 warm-up steps" in budget(families["plan_path_tool"])


def test_a_studys_runs_share_one_warm_up_folder_and_reuse_ignores_where_a_warm_up_came_from():
    """Every family of a study points its runs at one warm-up folder (train.warmup_cache: runs with
    the same warm-up inputs take one warm-up); a kept run of another study is the same run whether
    its warm-up was its own or shared, so reuse does not count that setting as a difference."""
    from mas_lab.study.reuse import _computed, differences
    from mas_lab.study.runner import warmup_cache

    families = load_study(ROOT / "studies" / "credit_matched.yaml", ROOT)
    folders = {warmup_cache(f) for f in families}
    assert len(families) == 2 and len(folders) == 1 and next(iter(folders)).endswith("/warmup")
    ours = {"train": {"seed": 0, "warmup_cache": "/study/warmup"}, "policies": {}}
    kept = {"train": {"seed": 0, "warmup_cache": None}, "policies": {}}
    assert differences(_computed(ours, None), _computed(kept, None)) == []
    assert differences(_computed({**ours, "train": {"seed": 1}}, None), _computed(kept, None)) == [
        "train.seed: 1 here, 0 kept"
    ]


def test_no_two_shipped_studies_name_a_task_alike():
    """A task key names the family's report section and its curves (reproduce_<key>.png): two
    studies with one key would overwrite each other's figure (the credit studies once did)."""
    keys = [f.key for p in sorted((ROOT / "studies").glob("*.yaml")) for f in load_study(p, ROOT)]
    assert len(keys) == len(set(keys)), keys
