"""Task files: valid ones load, wrong ones fail before any work with file, field and what is allowed."""

from pathlib import Path

import pytest
import yaml
from conftest import ROOT
from typer.testing import CliRunner

from mas_lab.cli import app
from mas_lab.config import TaskFileError, flat_params, load_task


def write(tmp_path: Path, mutate) -> Path:
    data = yaml.safe_load((ROOT / "tasks" / "toy.yaml").read_text())
    mutate(data)
    path = tmp_path / "task.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("name", ["toy.yaml", "plan_path.yaml"])
def test_shipped_task_files_load(name):
    task = load_task(ROOT / "tasks" / name)
    assert task.algorithm.k >= 2
    assert [r.name for r in task.roles]


def test_set_overrides_nested_and_list_fields():
    task = load_task(
        ROOT / "tasks" / "toy.yaml", ["algorithm.k=3", "roles.1.alpha=0.5", "train.seed=7", "env.params.letters=ab"]
    )
    assert (task.algorithm.k, task.roles[1].alpha, task.train.seed) == (3, 0.5, 7)
    assert task.env.params["letters"] == "ab"


CASES = [
    (
        "unknown key",
        lambda d: d["algorithm"].update(kk=4),
        "field 'algorithm.kk': unknown key; allowed: ['adamw', 'advantage', 'clip_eps_high'",
    ),
    ("wrong type", lambda d: d["train"].update(steps="many"), "field 'train.steps': Input should be a valid integer"),
    (
        "unknown env",
        lambda d: d["env"].update(name="chess"),
        "field 'env.name': unknown environment 'chess'; allowed: ['code', 'math', 'plan_path', 'reasoning_gym', 'sokoban', 'sudoku', 'toy']",
    ),
    (
        "unknown model",
        lambda d: d["policies"]["shared"].update(model="gpt-17"),
        "field 'policies.shared.model': unknown model 'gpt-17'; allowed: ['smollm2-135m-instruct', 'tiny-test']",
    ),
    ("k below two", lambda d: d["algorithm"].update(k=1), "field 'algorithm.k': must be at least 2"),
    (
        "role policy missing",
        lambda d: d["roles"][0].update(policy="nope"),
        "field 'roles.0.policy': 'nope' is not a policy; allowed: ['shared']",
    ),
    (
        "roles do not match env",
        lambda d: d["roles"].reverse(),
        "field 'roles': environment 'toy' has roles ['first', 'second']",
    ),
    (
        "bad filter",
        lambda d: d["algorithm"].update(filter="lowest_half"),
        "field 'algorithm.filter': Input should be 'none' or 'zero_std'",
    ),
    (
        "top level unknown",
        lambda d: d.update(trainer={}),
        "field 'trainer': unknown key; allowed: ['algorithm', 'checkpoint', 'env'",
    ),
    (
        "unknown engine",
        lambda d: d["policies"]["shared"].update(engine="sglang"),
        "field 'policies.shared.engine': Input should be 'hf' or 'vllm'",
    ),
    (
        "tis cap below one",
        lambda d: d["algorithm"].update(tis_cap=0.5),
        "field 'algorithm.tis_cap': must be at least 1",
    ),
    (
        "warm-up without demonstrations",
        lambda d: d["train"].update(warmup_steps=2),
        "field 'train.warmup_steps': environment 'toy' has no format demonstrations; allowed: 0",
    ),
]
try:
    import vllm  # noqa: F401
except ImportError:  # the default environment: a task asking for vLLM says how to get it
    CASES.append(
        (
            "vllm not installed",
            lambda d: d["policies"]["shared"].update(engine="vllm"),
            "field 'policies.shared.engine': 'vllm' needs the vllm package in this environment",
        )
    )
else:
    CASES.append(
        (
            "vllm lora with modules_to_save",
            lambda d: d["policies"]["shared"].update(engine="vllm", lora={"modules_to_save": ["lm_head"]}),
            "vLLM serves LoRA adapters without fully trained modules",
        )
    )


@pytest.mark.parametrize("case,mutate,message", CASES, ids=[c[0] for c in CASES])
def test_wrong_task_files_name_file_field_and_allowed(tmp_path, case, mutate, message):
    path = write(tmp_path, mutate)
    with pytest.raises(TaskFileError) as info:
        load_task(path)
    assert str(info.value).startswith(f"{path}: ")
    assert message in str(info.value)


def test_not_yaml_and_missing_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("env: [unclosed")
    with pytest.raises(TaskFileError, match="bad.yaml, line 1, column [0-9]+: not valid YAML"):
        load_task(bad)
    with pytest.raises(TaskFileError, match="no such task file"):
        load_task(tmp_path / "absent.yaml")


def test_bad_override_is_reported():
    with pytest.raises(TaskFileError, match="--set 'algorithm.k': expected key.path=value"):
        load_task(ROOT / "tasks" / "toy.yaml", ["algorithm.k"])


def test_cli_exits_2_before_any_work(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, lambda d: d["algorithm"].update(k=1))
    result = CliRunner().invoke(app, ["run", str(path)])
    assert result.exit_code == 2
    assert "algorithm.k" in result.output and "at least 2" in result.output
    assert not (tmp_path / "runs").exists() and not (tmp_path / "mlruns.db").exists()


def test_flat_params_cover_every_field(toy_task):
    params = flat_params(toy_task)
    assert params["algorithm.k"] == "8"
    assert params["roles.0.name"] == "first"
    assert params["policies.shared.model"] == "tiny-test"


@pytest.mark.parametrize(
    "override, message",
    [
        ("algorithm.k=1000000000000", "field 'algorithm.k': Input should be less than or equal to 1024"),
        ("train.eval_problems=1000000000000", "field 'train.eval_problems': Input should be less than or equal"),
        ("train.problems_per_step=1000000000000", "field 'train.problems_per_step': Input should be less than or"),
        ("algorithm.lr=.inf", "field 'algorithm.lr': Input should be a finite number"),
        ("algorithm.lr=.nan", "field 'algorithm.lr': Input should be a finite number"),
        ("train.steps=true", "field 'train.steps': expected a number, got a boolean"),
        ("algorithm.kl_coef=false", "field 'algorithm.kl_coef': expected a number, got a boolean"),
    ],
)
def test_bounds_booleans_and_infinities_are_refused_before_any_work(override, message):
    with pytest.raises(TaskFileError) as caught:
        load_task(ROOT / "tasks" / "toy.yaml", [override])
    assert message in str(caught.value)


def test_a_duplicate_section_is_refused_not_silently_replaced(tmp_path):
    text = (ROOT / "tasks" / "toy.yaml").read_text() + "\ntrain:\n  steps: 1\n"
    path = tmp_path / "twice.yaml"
    path.write_text(text)
    with pytest.raises(TaskFileError, match=r"key 'train' appears twice in one section"):
        load_task(path)


def test_deep_nesting_and_huge_values_get_one_short_line(tmp_path):
    deep = tmp_path / "deep.yaml"
    deep.write_text("a: " + "[" * 20000 + "]" * 20000 + "\n")
    with pytest.raises(TaskFileError) as caught:
        load_task(deep)
    assert "nested too deeply" in str(caught.value) or "not valid YAML" in str(caught.value)
    assert len(str(caught.value)) < 700
    huge = tmp_path / "huge.yaml"
    huge.write_text((ROOT / "tasks" / "toy.yaml").read_text().replace("name: toy", "name: " + "x" * 500_000))
    with pytest.raises(TaskFileError) as caught:
        load_task(huge)
    assert len(str(caught.value)) < 700 and "characters)" in str(caught.value)


def test_config_refuses_a_runs_dir_that_run_would_refuse(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    result = CliRunner().invoke(
        app, ["config", str(ROOT / "tasks" / "toy.yaml"), "--set", f"tracking.runs_dir={blocker / 'runs'}"]
    )
    assert result.exit_code == 2 and "is a file, not a folder" in result.output
    ok = CliRunner().invoke(app, ["config", str(ROOT / "tasks" / "toy.yaml"), "--set", f"tracking.runs_dir={tmp_path}"])
    assert ok.exit_code == 0 and "runs_dir" in ok.output


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["env.params.size=2", "train.eval_problems=2", "env.params.wall_prob=0.0"], "distinct evaluation problems"),
        (["env.params.size=2", "train.eval_problems=0", "train.problems_per_step=100"], "distinct training problems"),
    ],
)
def test_a_task_that_cannot_make_its_problems_fails_before_a_run_folder_exists(tmp_path, overrides, message):
    """Plan-Path 2x2 has too few distinct problems for 2 held out (one content-hash bucket in 8)
    or 100 a step: one line, exit 2, no run folder (it used to raise after the folder existed, or
    loop forever)."""
    args = [
        str(ROOT / "tasks" / "plan_path_tiny.yaml"),
        *(a for o in overrides for a in ("--set", o)),
        "--set",
        "env.params.min_distance=1",
        "--set",
        f"tracking.runs_dir={tmp_path / 'runs'}",
    ]
    for command in (["config"], ["run", "--no-ray"]):
        result = CliRunner().invoke(app, [*command, *args])
        assert result.exit_code == 2 and message in result.output, result.output
        assert len(result.output.strip().splitlines()) <= 3
    assert not (tmp_path / "runs").exists() and not (tmp_path / "mlruns.db").exists()
