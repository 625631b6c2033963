"""Running the comparison's regimes: one `mas-lab run` per regime and seed, resumable across
sessions (an interrupted run continues from its checkpoint; wall and CPU time add up over the
attempts), the swap ablation of per-role runs, and keeping each finished run in the repository."""

from __future__ import annotations

import fcntl
import json
import lzma
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from mas_lab.records import checkpoint
from mas_lab.records.control import lock_held
from mas_lab.records.store import RunStore
from mas_lab.sandbox.children import die_with_parent
from mas_lab.study.families import Family, archive_folder, slug
from mas_lab.study.spec import read_kept_json

MAS_LAB = str(Path(sys.executable).parent / "mas-lab")
STORE = "run.db.xz"  # a kept run's store, in its archive folder


def last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def describe_exit(code: int) -> str:
    """A failed run's exit status in words: a negative code is the signal that ended it, and
    SIGKILL from nobody in particular is most often the kernel's out-of-memory killer."""
    if code >= 0:
        return f"exit {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        return f"killed by signal {-code}"
    if name == "SIGKILL":
        return (
            "killed by SIGKILL, most often the out-of-memory killer (see `dmesg`; each attempt's peak "
            "memory is max_rss_mb in segments.json): run fewer jobs at once"
        )
    return f"killed by {name}"


def process_cpu(pid: int) -> float:
    """CPU seconds of a running process and of its children it has waited for (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime stime cutime cstime


def unfinished(folder: Path, wait_s: float = 180.0) -> Path | None:
    """The run folder an earlier, interrupted attempt left with a checkpoint to resume from; an
    attempt stopped before its first checkpoint is removed (it had nothing to keep). A folder whose
    run is still alive (its lock held: a driver just killed, its run writing the checkpoint of its
    SIGTERM) is waited for; one held for longer than `wait_s` raises RunningElsewhere."""
    for run_dir in sorted(p.parent for p in (folder / "runs").glob("*/run.db")):
        deadline = time.monotonic() + wait_s
        while lock_held(run_dir):
            if time.monotonic() > deadline:
                raise RunningElsewhere(f"{run_dir}: another process is running it")
            time.sleep(1.0)
        if checkpoint.complete(run_dir):
            return run_dir
        shutil.rmtree(run_dir)
    return None


class RunningElsewhere(RuntimeError):
    """A cell whose run another live process holds (a second driver of the same study)."""


def node_label() -> str:
    """Where this process runs: the host, and the Ray node id inside a Ray worker."""
    label = socket.gethostname()
    try:
        # lazy: ray (~0.4 s), only where the actors run
        import ray

        if ray.is_initialized():
            label += f" ray:{ray.get_runtime_context().get_node_id()[:12]}"
    except Exception:  # noqa: BLE001 - outside Ray, or a Ray without a runtime context
        pass
    return label


def warmup_cache(family: Family) -> str:
    """The override that points a study's runs at its shared warm-ups (one folder per study)."""
    return f"train.warmup_cache={(Path(family.study_out or family.out) / 'warmup').resolve()}"


def run_regime(
    family: Family, name: str, seed: int, out: Path, extra: list[str], tracking: tuple[str, ...] = ()
) -> dict | None:
    """One regime and seed: a fresh `mas-lab run`, or `mas-lab run --resume` of the attempt an
    earlier session left (a session that ends mid-run loses at most the step in flight). Wall and
    CPU time add up over the attempts (segments.json, written every 15 s while a run goes), and each
    attempt records the node it ran on. `tracking`: overrides naming the study's MLflow parent run
    and tags (a new run only: a resumed run keeps its own MLflow run)."""
    folder = out / slug(name) / f"seed-{seed}"
    summary_file = folder / "summary.json"
    if summary_file.is_file():
        return read_kept_json(summary_file)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "cell.lock", "a") as lock:
        try:  # one driver a cell: two studies with one `out`, started together, once both trained it
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"[study] {name} seed {seed}: another study is training this cell; left to it", file=sys.stderr)
            return None
        if summary_file.is_file():  # kept by the driver that held the lock before us
            return read_kept_json(summary_file)
        return _run_cell(family, name, seed, folder, extra, tracking)


def _run_cell(
    family: Family, name: str, seed: int, folder: Path, extra: list[str], tracking: tuple[str, ...]
) -> dict | None:
    """run_regime's work, under the cell's lock."""
    summary_file = folder / "summary.json"
    task, overrides = family.regimes[name]
    # the arms of one seed that differ only in what the warm-up never reads share one warm-up
    # (train.warmup_cache, training/warmup.py), unless the study or the call names another folder
    shared = [] if any(s.startswith("train.warmup_cache=") for s in [*overrides, *extra]) else [warmup_cache(family)]
    sets = [
        *family.common,
        *overrides,
        *extra,
        *shared,
        f"train.seed={seed}",
        f"tracking.runs_dir={folder / 'runs'}",
        f"tracking.mlflow_uri=sqlite:///{family.mlflow_store.resolve()}",
    ]
    command = [MAS_LAB, "run", task, "--no-ray", *[a for s in [*sets, *tracking] for a in ("--set", s)]]
    try:
        resume_dir = unfinished(folder)
    except RunningElsewhere as exc:
        print(f"[study] {name} seed {seed}: {exc}; left to it", file=sys.stderr, flush=True)
        return None
    segments_file = folder / "segments.json"
    segments = read_kept_json(segments_file) if resume_dir and segments_file.is_file() else []
    # a resumed run keeps its own settings; only its placement (torch threads of this study's --jobs) follows this call
    placement = [a for s in sets if s.startswith("resources.") for a in ("--set", s)]
    launch = [MAS_LAB, "run", "--resume", str(resume_dir), "--no-ray", *placement] if resume_dir else command
    print(f"[study] {family.key}: {name} seed {seed}: {' '.join(launch[1:])}", file=sys.stderr, flush=True)
    segment = {"resumed": str(resume_dir) if resume_dir else None, "wall_s": 0.0, "cpu_s": 0.0, "node": node_label()}
    segments.append(segment)
    started = time.perf_counter()
    with open(folder / "run.log", "a" if resume_dir else "w") as log:
        proc = subprocess.Popen(
            launch, cwd=family.root, stdout=subprocess.PIPE, stderr=log, text=True, preexec_fn=die_with_parent
        )
        output: list[str] = []
        reader = threading.Thread(target=lambda: output.extend(proc.stdout or []), daemon=True)
        reader.start()
        polled = 0.0
        while True:  # wait4 gives this child's own CPU time (another job's children are not mixed in)
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                proc.returncode = os.waitstatus_to_exitcode(status)
                break
            if time.perf_counter() - polled >= 15:
                polled = time.perf_counter()
                try:
                    segment.update(wall_s=round(polled - started, 1), cpu_s=round(process_cpu(proc.pid), 1))
                except (OSError, ValueError, IndexError):
                    pass  # the process ended between wait4 and the read
                segments_file.write_text(json.dumps(segments, indent=1))
            time.sleep(0.5)
        reader.join()
    segment.update(
        wall_s=round(time.perf_counter() - started, 1),
        cpu_s=round(usage.ru_utime + usage.ru_stime, 1),
        max_rss_mb=round(usage.ru_maxrss / 1024),  # Linux: kilobytes; the run's peak resident memory
    )
    segments_file.write_text(json.dumps(segments, indent=1))
    # `mas-lab run` exits 128 + N when signal N stopped it with a checkpoint, 3 when `mas-lab stop` did
    stopped = proc.returncode in (3, 128 + signal.SIGINT, 128 + signal.SIGTERM)
    if proc.returncode != 0 and not stopped:
        print(
            f"[study] {family.key}: {name} seed {seed} failed ({describe_exit(proc.returncode)}); the next "
            f"`mas-lab study run` continues it from its checkpoint if it wrote one; see {folder / 'run.log'}",
            file=sys.stderr,
        )
        return None
    summary = last_json("".join(output))
    if stopped or summary.get("stopped"):  # a signal stopped it with a checkpoint: unfinished, not a result
        print(
            f"[study] {family.key}: {name} seed {seed} stopped after step {summary.get('steps')} (a signal); "
            "not kept: the next `mas-lab study` continues it from its checkpoint",
            file=sys.stderr,
        )
        return None
    result = {
        "regime": name,
        "seed": seed,
        "task": task,
        "overrides": sets,
        "command": " ".join(command[1:]),
        "run_dir": str((Path(family.root) / summary["run_dir"]).resolve()),
        "wall_s": round(sum(x["wall_s"] for x in segments), 1),
        "cpu_s": round(sum(x["cpu_s"] for x in segments), 1),
        "attempts": len(segments),
        "placement": [x.get("node") for x in segments],
        "summary": summary,
    }
    if name in family.swapped:
        result["swap"] = swap_eval(family, task, seed, Path(result["run_dir"]), folder)
    summary_file.write_text(json.dumps(result, indent=1))
    return result


def swap_eval(family: Family, task: str, seed: int, run_dir: Path, folder: Path) -> dict | None:
    """The swap ablation: the trained per-role policies with the role -> policy map rotated."""
    checkpoints = checkpoint.complete(run_dir)  # sealed ones, in step order
    if not checkpoints:
        return None
    command = [
        MAS_LAB,
        "eval",
        task,
        "--checkpoint",
        str(checkpoints[-1]),
        "--swap-policies",
        "--no-ray",
        "--set",
        f"train.seed={seed}",
        "--set",
        f"tracking.runs_dir={folder / 'swap'}",
        "--set",
        f"tracking.mlflow_uri=sqlite:///{family.mlflow_store.resolve()}",
    ]
    proc = subprocess.run(command, cwd=family.root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        print(f"[study] swap eval failed: {proc.stderr[-2000:]}", file=sys.stderr)
        return None
    return {"checkpoint": checkpoints[-1].name, "command": " ".join(command[1:]), **last_json(proc.stdout)}


def keep(result: dict, archive: Path) -> None:
    """Keep a finished run in the repository: its summary, its resolved task.yaml and its store,
    xz-compressed (a 30-step store of ~2.6 MB keeps in ~0.2 MB), so the tables and curves can be
    rebuilt on any clone and a later session, on a new machine whose sweeps/ is gone, does not run
    it again. Checkpoints, logs and MLflow's database stay in the work folder."""
    folder = archive_folder(archive, result["regime"], result["seed"])
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "run.db"
        RunStore.copy(Path(result["run_dir"]) / "run.db", copy)  # a consistent copy, whatever the journal mode
        with open(copy, "rb") as plain, lzma.open(folder / STORE, "wb", preset=9) as packed:
            shutil.copyfileobj(plain, packed)
    shutil.copyfile(Path(result["run_dir"]) / "task.yaml", folder / "task.yaml")  # the resolved task
    (folder / "summary.json").write_text(json.dumps(result, indent=1) + "\n")  # last: it marks the run kept


def drop_checkpoints(results: list[dict]) -> list[Path]:
    """`study run --drop-checkpoints`: the checkpoints of runs kept in the archive (each run's last
    sealed weights and optimizer state: ~1.6 GB for the 135M model in float32, so a 24-run study
    fills a disk with runs it will not continue), removed; their stores, summaries and task files
    stay, in the work folder and in the archive. A run whose folder is locked (running) is left.
    Returns the folders removed."""
    removed = []
    for result in results:
        run_dir = Path(result["run_dir"])
        if (run_dir / "checkpoints").is_dir() and (run_dir / "run.db").is_file() and not lock_held(run_dir):
            shutil.rmtree(run_dir / "checkpoints")
            removed.append(run_dir / "checkpoints")
    return removed


def complete(out: Path, archive: Path | None = None, order: tuple[str, ...] = ()) -> list[dict]:
    """The finished runs: those kept in the archive (default <out>/archive), after keeping there
    any run finished in the work folder `out` that is not kept yet; in `order` of regimes, then seed."""
    archive = archive or out / "archive"
    for path in sorted(out.glob("*/seed-*/summary.json")):
        result = read_kept_json(path)
        if not (archive_folder(archive, result["regime"], result["seed"]) / "summary.json").is_file():
            keep(result, archive)
    found = []
    for path in sorted(archive.glob("*/seed-*/summary.json")):
        found.append({**read_kept_json(path), "store": str(path.parent / STORE)})
    rank = {name: i for i, name in enumerate(order)}
    return sorted(found, key=lambda r: (rank.get(r["regime"], len(rank)), r["regime"], r["seed"]))
