"""Getting data and policies out of a run, in the formats the field's tools read.

- `export_records`: one record per candidate (or per chosen action) with problem, role, turn, the
  chat messages the policy saw and its response, reward and components, advantage, the chosen
  flag, the sampler's log-probs, step and policy: ready for SFT (`messages`), rejection sampling
  (`reward`, `chosen`) or analysis. JSON lines or Parquet, the same fields in both:
  `pandas.read_json(PATH, lines=True)` or `pandas.read_parquet(PATH)` (or Hugging Face's
  `datasets.load_dataset("json" | "parquet", data_files=PATH)` where it is installed).
- `export_policy`: a Hugging Face model folder (config, tokenizer, safetensors) from a checkpoint:
  a full policy as it is; a LoRA policy merged into its base, or kept as a peft adapter folder.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
from pathlib import Path
from typing import Iterator

from pydantic import ValidationError

from mas_lab.config import TaskConfig
from mas_lab.modeling.models import resolve
from mas_lab.records import checkpoint as checkpoints
from mas_lab.records.store import RunStore

FORMATS = ("jsonl", "parquet")


class ExportError(Exception):
    """An export that cannot be made; the message says why."""


def records(
    store: RunStore, kind: str = "train", steps: tuple[int | None, int | None] = (None, None), chosen_only: bool = False
) -> Iterator[dict]:
    """The store's candidates as export records (streamed), the same fields in every format:
    `problem` and `components` (whose keys differ by task and role) as JSON text; evaluation rows
    (greedy, never trained on) have no advantage and no log-probs (null); `group_kept` says whether
    the candidate's group reached the learner (false: the zero-std filter dropped it; null: eval)."""
    for r in store.candidate_records(kind, steps[0], steps[1], chosen_only):
        messages = ([{"role": "system", "content": r["system"]}] if r["system"] else []) + [
            {"role": "user", "content": r["observation"]},
            {"role": "assistant", "content": r["response"] or ""},
        ]
        evaluated = r["kind"] != "train"
        yield {
            **r,
            "problem": json.dumps(r["problem"], sort_keys=True),
            "components": json.dumps(r["components"], sort_keys=True),
            "advantage": None if evaluated else r["advantage"],
            "logprobs": r["logprobs"] or None,
            "messages": messages,
        }


def export_records(
    run_dir: Path,
    output: Path,
    fmt: str = "jsonl",
    kind: str = "train",
    steps: tuple[int | None, int | None] = (None, None),
    chosen_only: bool = False,
) -> int:
    """Write the records of a run to `output`; returns how many were written."""
    if fmt not in FORMATS:
        raise ExportError(f"unknown format '{fmt}'; allowed: {list(FORMATS)}")
    store = RunStore(Path(run_dir) / "run.db", create=False)
    rows = records(store, kind, steps, chosen_only)
    try:
        first = next(rows, None)
        if first is None:  # nothing matched: no empty file
            return 0
        output.parent.mkdir(parents=True, exist_ok=True)
        rows = itertools.chain([first], rows)
        # written beside the output and renamed over it when whole: a full disk or a crash leaves no
        # partial file that blocks the retry (nor a half-replaced one)
        partial = output.with_name(f".{output.name}.partial-{os.getpid()}")
        try:
            if fmt == "jsonl":
                count = 0
                with open(partial, "w") as handle:
                    for record in rows:
                        handle.write(json.dumps(record) + "\n")
                        count += 1
            else:
                count = _parquet(rows, partial)
            partial.replace(output)
        finally:
            partial.unlink(missing_ok=True)
        return count
    finally:
        store.close()


def _schema():
    # lazy: pyarrow, only for a parquet export
    import pyarrow as pa

    text, integer, real = pa.string(), pa.int64(), pa.float64()
    return pa.schema(
        [
            ("step", integer),
            ("kind", text),
            ("episode", integer),
            ("problem_id", text),
            ("problem", text),
            ("episode_success", pa.bool_()),
            ("turn", integer),
            ("role", text),
            ("policy", text),
            ("system", text),
            ("observation", text),
            ("candidate", integer),
            ("response", text),
            ("prompt_tokens", integer),
            ("response_tokens", integer),
            ("reward", real),
            ("team", real),
            ("local", real),
            ("components", text),
            ("advantage", real),
            ("chosen", pa.bool_()),
            ("info", text),
            ("logprobs", pa.list_(pa.float32())),
            ("policy_version", integer),
            ("group_kept", pa.bool_()),
            ("messages", pa.list_(pa.struct([("role", text), ("content", text)]))),
        ]
    )


def _parquet(rows: Iterator[dict], output: Path, batch: int = 5000) -> int:
    """Parquet in row groups of `batch` records; problem and components (dicts whose keys vary by
    task) are JSON text."""
    # lazy: pyarrow, only for a parquet export
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema, count, chunk = _schema(), 0, []
    with pq.ParquetWriter(output, schema) as writer:
        for record in rows:
            chunk.append(record)
            if len(chunk) == batch:
                writer.write_table(pa.Table.from_pylist(chunk, schema=schema))
                count, chunk = count + len(chunk), []
        if chunk:
            writer.write_table(pa.Table.from_pylist(chunk, schema=schema))
            count += len(chunk)
    return count


def export_policy(checkpoint: Path, policy: str, output: Path, merge: bool = True) -> Path:
    """A Hugging Face folder of one policy of a checkpoint (or of a folder of saved policies)."""
    state_file = checkpoint / "state.json"
    folder = checkpoint / "policies" / policy
    if not state_file.is_file() or not folder.is_dir():
        found = (
            sorted(p.name for p in (checkpoint / "policies").iterdir()) if (checkpoint / "policies").is_dir() else []
        )
        raise ExportError(f"{checkpoint}: no checkpoint of policy '{policy}' (policies here: {found})")

    if (checkpoint / "manifest.json").is_file():  # every file against its recorded size and SHA-256
        try:
            checkpoints.verify(checkpoint)
        except checkpoints.CheckpointError as exc:
            raise ExportError(str(exc)) from None
    try:
        state = json.loads(state_file.read_text())
        task = TaskConfig.model_validate(state["task"])
    except (ValueError, KeyError, TypeError) as exc:
        if isinstance(exc, ValidationError):  # e.g. a plugin's environment that is not installed here
            why = "; ".join(
                (f"{'.'.join(map(str, e['loc']))}: " if e["loc"] else "") + e["msg"].removeprefix("Value error, ")
                for e in exc.errors()[:3]
            )
            raise ExportError(f"{state_file}: its task does not load here ({why})") from None
        raise ExportError(f"{state_file}: damaged ({type(exc).__name__}: {exc})") from None
    if policy not in task.policies:
        raise ExportError(f"{checkpoint}: no policy '{policy}' in its task (policies: {sorted(task.policies)})")
    spec = task.policies[policy]
    out = output.resolve()
    if out == checkpoint.resolve() or checkpoint.resolve() in out.parents:
        raise ExportError(f"{output}: inside the checkpoint it exports; give a folder outside it")
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise ExportError(f"{output}: exists and is not an empty folder; give a new folder")
    base = Path(resolve(spec.model))
    output.mkdir(parents=True, exist_ok=True)
    if spec.lora is None:
        for item in base.iterdir():  # config, generation config, tokenizer
            if item.is_file() and not item.name.endswith((".safetensors", ".bin")) and not item.name.startswith("."):
                shutil.copy2(item, output / item.name)
        shutil.copy2(folder / "model.safetensors", output / "model.safetensors")
        return output
    # lazy: safetensors, torch and transformers, only when a policy is exported
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # lazy: torch and peft, only when a policy is exported
    from mas_lab.modeling import lora

    model = lora.attach(AutoModelForCausalLM.from_pretrained(base), {policy: spec.lora})
    lora.load_adapter_state(model, policy, load_file(str(folder / "adapter.safetensors")))
    AutoTokenizer.from_pretrained(base).save_pretrained(output)
    if merge:
        model.merge_and_unload().save_pretrained(output)
    else:
        model.save_pretrained(output, selected_adapters=[policy])
        nested = output / policy  # peft writes a non-default adapter into a subfolder of its name
        if nested.is_dir():
            for item in nested.iterdir():
                shutil.move(str(item), output / item.name)
            nested.rmdir()
        config = json.loads((output / "adapter_config.json").read_text())
        config["base_model_name_or_path"] = str(base)
        (output / "adapter_config.json").write_text(json.dumps(config, indent=1))
    return output
