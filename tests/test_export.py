"""Export: records that datasets-style readers load, and policies that from_pretrained loads."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT

from mas_lab.records.store import RunStore

MAS_LAB = str(Path(sys.executable).parent / "mas-lab")


def cli(*args, cwd):
    proc = subprocess.run([MAS_LAB, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


@pytest.fixture(scope="module")
def runs(toy_run):
    """The session's toy run (a full policy)."""
    cwd, run_dir, _ = toy_run
    return cwd, {"toy.yaml": run_dir}


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """A toy run with one LoRA adapter per role."""
    cwd = tmp_path_factory.mktemp("export-lora")
    args = ["--no-ray", "--set", "train.steps=2", "--set", "resources.torch_threads=1"]
    proc = cli("run", ROOT / "tasks" / "toy_lora.yaml", *args, cwd=cwd)
    return cwd, cwd / json.loads(proc.stdout.splitlines()[-1])["run_dir"]


def test_jsonl_and_parquet_hold_every_candidate_with_its_messages_and_logprobs(runs):
    import pyarrow.parquet as pq

    cwd, found = runs
    run_dir = found["toy.yaml"]
    store = RunStore(run_dir / "run.db", create=False)
    total = store.rows(
        "SELECT COUNT(*) AS n FROM candidates c JOIN turns t ON c.turn_id = t.id JOIN episodes e"
        " ON t.episode_id = e.id WHERE e.kind = 'train'"
    )[0]["n"]
    cli("export", run_dir, "-o", cwd / "all.jsonl", cwd=cwd)
    rows = [json.loads(line) for line in (cwd / "all.jsonl").read_text().splitlines()]
    assert len(rows) == total > 0
    for r in rows:
        assert r["messages"][-1] == {"role": "assistant", "content": r["response"]}
        assert r["messages"][-2]["content"] == r["observation"] and len(r["logprobs"]) == r["response_tokens"]
        assert {
            "step",
            "role",
            "turn",
            "reward",
            "team",
            "local",
            "components",
            "advantage",
            "chosen",
            "policy",
        } <= set(r)
    cli("export", run_dir, "-o", cwd / "late.parquet", "--format", "parquet", "--steps", "2:", cwd=cwd)
    table = pq.read_table(cwd / "late.parquet").to_pylist()
    assert len(table) == sum(r["step"] >= 2 for r in rows) and {r["step"] for r in table} == {2, 3}
    assert table[0]["messages"][-1]["role"] == "assistant" and json.loads(table[0]["components"])
    cli("export", run_dir, "-o", cwd / "eval.jsonl", "--kind", "eval", "--chosen-only", cwd=cwd)
    chosen = [json.loads(line) for line in (cwd / "eval.jsonl").read_text().splitlines()]
    turns = store.rows("SELECT COUNT(*) AS n FROM turns t JOIN episodes e ON t.episode_id = e.id WHERE e.kind = 'eval'")
    assert len(chosen) == turns[0]["n"] and all(r["chosen"] and r["kind"] == "eval" for r in chosen)


def test_a_full_policy_exports_as_a_folder_from_pretrained_loads(runs):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cwd, found = runs
    checkpoint = sorted((found["toy.yaml"] / "checkpoints").glob("step-*"))[-1]
    cli("export-policy", checkpoint, "shared", cwd / "full", cwd=cwd)
    model = AutoModelForCausalLM.from_pretrained(cwd / "full")
    AutoTokenizer.from_pretrained(cwd / "full")
    saved = load_file(str(checkpoint / "policies" / "shared" / "model.safetensors"))
    state = model.state_dict()
    assert saved and all(torch.equal(state[k], v) for k, v in saved.items())


@pytest.mark.integration
def test_a_lora_policy_exports_merged_or_as_an_adapter_with_the_same_outputs(lora_run):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from mas_lab.modeling.models import resolve

    cwd, run_dir = lora_run
    checkpoint = sorted((run_dir / "checkpoints").glob("step-*"))[-1]
    cli("export-policy", checkpoint, "first", cwd / "merged", cwd=cwd)
    cli("export-policy", checkpoint, "first", cwd / "adapter", "--adapter", cwd=cwd)
    merged = AutoModelForCausalLM.from_pretrained(cwd / "merged").eval()
    adapted = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(resolve("tiny-test")), cwd / "adapter"
    ).eval()
    ids = torch.tensor([[2, 10, 20, 30, 40, 3]])
    with torch.no_grad():
        assert torch.allclose(merged(ids).logits, adapted(ids).logits, atol=1e-5)
    base = AutoModelForCausalLM.from_pretrained(resolve("tiny-test")).eval()
    with torch.no_grad():
        assert not torch.allclose(base(ids).logits, merged(ids).logits, atol=1e-5)  # training moved it


def test_a_missing_policy_says_which_there_are(runs, tmp_path):
    cwd, found = runs
    checkpoint = sorted((found["toy.yaml"] / "checkpoints").glob("step-*"))[-1]
    proc = subprocess.run(
        [MAS_LAB, "export-policy", str(checkpoint), "first", str(tmp_path / "x")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "['shared']" in proc.stderr


def test_plot_writes_a_png_per_chart(runs):
    cwd, found = runs
    out = cli("plot", found["toy.yaml"], "-o", cwd / "plots", cwd=cwd).stdout.split()
    names = {Path(p).stem for p in out}
    assert {"success", "reward_per_role", "reward_per_agent_turn", "team", "learner", "sampling", "time"} <= names
    for path in out:
        data = Path(cwd / path if not Path(path).is_absolute() else path).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_export_reads_the_format_from_the_suffix_and_refuses_what_it_cannot_do(runs, tmp_path):
    """`-o x.parquet` wrote JSON lines; an existing file was replaced silently; an unwritable target
    gave a traceback; a range with no steps said "0 records". Each is one line and exit 2 now, and
    the two formats hold the same fields: problem and components as JSON text in both, eval rows
    with null advantage and log-probs, and whether each candidate's group reached the learner."""
    import pyarrow.parquet as pq
    from typer.testing import CliRunner

    from mas_lab.cli import app

    _, found = runs
    run_dir = str(found["toy.yaml"])
    invoke = lambda *args: CliRunner().invoke(app, ["export", run_dir, *map(str, args)])  # noqa: E731
    assert invoke("-o", tmp_path / "a.parquet").exit_code == 0
    assert pq.read_table(tmp_path / "a.parquet").num_rows > 0  # Parquet, from the suffix
    again = invoke("-o", tmp_path / "a.parquet")
    assert again.exit_code == 2 and "exists; add --force" in again.output
    assert invoke("-o", tmp_path / "a.parquet", "--force").exit_code == 0
    blocker = tmp_path / "file"
    blocker.write_text("")
    for bad, said in (
        (tmp_path / "x.csv", "cannot tell the format"),
        (blocker / "x.jsonl", "not a writable folder"),
        (tmp_path / "x.jsonl", "the suffix says jsonl"),
    ):
        result = invoke(
            "-o", bad, *(["--format", "parquet"] if bad.name == "x.jsonl" and bad.parent == tmp_path else [])
        )
        assert result.exit_code == 2 and said in result.output, result.output
    empty = invoke("-o", tmp_path / "none.jsonl", "--steps", "500:600")
    assert empty.exit_code == 2 and "nothing written" in empty.output and not (tmp_path / "none.jsonl").exists()
    assert invoke("-o", tmp_path / "t.jsonl").exit_code == 0
    lines = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    table = pq.read_table(tmp_path / "a.parquet").to_pylist()
    assert set(lines[0]) == set(table[0]) and lines[0]["components"] == table[0]["components"]
    assert isinstance(lines[0]["problem"], str) and json.loads(lines[0]["problem"]) == json.loads(table[0]["problem"])
    assert all(r["group_kept"] in (True, False) for r in lines)
    assert invoke("-o", tmp_path / "e.jsonl", "--kind", "eval").exit_code == 0
    evals = [json.loads(line) for line in (tmp_path / "e.jsonl").read_text().splitlines()]
    assert evals and all(r["advantage"] is None and r["logprobs"] is None and r["group_kept"] is None for r in evals)


@pytest.mark.parametrize(
    "damage, said",
    [
        ("truncate", "truncated checkpoint (policies/shared/model.safetensors"),
        ("garbage state", "truncated checkpoint (state.json has 8 bytes"),
        ("plugin task", "its task does not load here (env.name"),
        ("own folder", "inside the checkpoint it exports"),
        ("existing file", "exists and is not an empty folder"),
    ],
)
def test_export_policy_refuses_a_damaged_checkpoint_or_a_bad_output_in_one_line(runs, tmp_path, damage, said):
    """A truncated model.safetensors once exported with exit 0; a garbage state.json, an uninstalled
    plugin's task, its own folder or an existing file as output gave tracebacks."""
    import shutil

    from mas_lab.analysis.export import ExportError, export_policy

    _, found = runs
    checkpoint = tmp_path / "ckpt"
    shutil.copytree(sorted((found["toy.yaml"] / "checkpoints").glob("step-*"))[-1], checkpoint)
    output = tmp_path / "out"
    if damage == "truncate":
        weights = checkpoint / "policies" / "shared" / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:1000])
    elif damage == "garbage state":
        (checkpoint / "state.json").write_text("{garbage")
    elif damage == "plugin task":
        (checkpoint / "manifest.json").unlink()  # a folder of saved policies: no manifest to check
        state = json.loads((checkpoint / "state.json").read_text())
        state["task"]["env"]["name"] = "a_plugin_not_installed"
        (checkpoint / "state.json").write_text(json.dumps(state))
    elif damage == "own folder":
        output = checkpoint / "policies" / "shared"
    elif damage == "existing file":
        output.write_text("keep me")
    with pytest.raises(ExportError, match=re.escape(said)):
        export_policy(checkpoint, "shared", output)
    if damage == "existing file":
        assert output.read_text() == "keep me"
