"""`hacfed demo`: a whole federation on this machine through real Flower processes.

    hacfed demo                                  # 3 tiny agents, different tokenizers, a few minutes
    hacfed demo --agents tiny-llama,tiny-gpt2 --rounds 10 --metrics-out runs/demo.jsonl

Starts `hacfed-server` (Flower SuperLink + the hacfed ServerApp, on loopback) and one
`hacfed-client` per agent (resident participant + Flower SuperNode), set up the way a real
federation is (README "Running a real federation"): a federation CA and server certificate
generated into the demo's state dir, TLS, and every lab's enrolment registered, so Flower's SuperNode
authentication admits exactly these labs. `--insecure` runs plaintext instead (development only).
It shows the coordinator's live progress, then a before/after held-out accuracy table, the JSONL
metrics (same format as `hacfed sim`) and a PNG plot of accuracy per round. Every process it
started is gone when it exits, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from hacfed.tools.modes import MODE_NAMES, RECOMMENDED, get_mode, modes_help

if TYPE_CHECKING:  # imported where it starts processes, after the arguments are parsed
    from hacfed.procs import ManagedProcess

DEFAULT_AGENTS = "tiny-llama,tiny-gpt2,tiny-qwen2"
DEMO_MODE = RECOMMENDED
_READY = re.compile(r"ready: Fleet API on (\S+?:\d+)")
DEFAULT_METRICS, DEFAULT_PLOT = "runs/demo-metrics.jsonl", "runs/demo-accuracy.png"
OUTPUTS_FILE = "demo-outputs.json"  # in the state dir: a resumed demo keeps writing the same results


def add_parser(sub: Any) -> None:
    p = sub.add_parser("demo", help="local federation of tiny heterogeneous agents over real Flower processes",
                       description=__doc__.splitlines()[0], epilog=modes_help(),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--agents", default=DEFAULT_AGENTS, help=f"comma-separated presets (default {DEFAULT_AGENTS})")
    p.add_argument("--rounds", type=int, default=30, help="federation rounds (default 30: a few minutes on 2 cores)")
    p.add_argument("--mode", choices=MODE_NAMES, default=DEMO_MODE, metavar="MODE",
                   help=f"training mode, one of the list below (default {DEMO_MODE})")
    p.add_argument("--prompts-per-round", type=int, default=16)
    p.add_argument("--group-size", type=int, default=8, help="responses per prompt per agent (G)")
    p.add_argument("--eval-every", type=int, default=10,
                   help="greedy held-out evaluation every K rounds (0: only at the end)")
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dashboard", metavar="HOST:PORT", default=None,
                   help="hacfed-server --dashboard: the live read-only page at http://HOST:PORT/ (loopback only)")
    p.add_argument("--state-dir", default=None, help="where servers, labs and logs live (default: a temp dir, removed)")
    p.add_argument("--metrics-out", default=None, help=f"JSONL metrics; never overwritten (default {DEFAULT_METRICS}, "
                   "or runs/demo-2-metrics.jsonl, ... when an earlier demo's results are there)")
    p.add_argument("--plot", default=None, help=f"PNG plot of accuracy per round; never overwritten (default "
                   f"{DEFAULT_PLOT}, numbered like --metrics-out)")
    p.add_argument("--tensorboard", metavar="DIR", default=None,
                   help="each lab writes TensorBoard event files to DIR/<lab id> (hacfed-client --tensorboard)")
    p.add_argument("--insecure", action="store_true",
                   help="plaintext without SuperNode authentication (development only; the default is TLS with "
                        "certificates and lab keys generated into the state dir)")


def run_from_args(args: Any) -> int:
    agents = [a.strip() for a in args.agents.split(",") if a.strip()]
    problems = []
    if len(agents) < 2:
        problems.append(f"--agents needs at least two agents, got {args.agents!r}")
    for name in ("rounds", "prompts_per_round", "group_size"):
        if getattr(args, name) < 1:
            problems.append(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.eval_every < 0 or not args.lr > 0:
        problems.append(f"--eval-every must be >= 0 and --lr > 0, got {args.eval_every} / {args.lr}")
    if getattr(args, "tensorboard", None):
        from hacfed.metrics_sinks import MissingPackage, require_tensorboard

        try:
            require_tensorboard()
        except MissingPackage as exc:
            problems.append(str(exc))
    if getattr(args, "dashboard", None):
        from hacfed.config_values import check_port_free
        from hacfed.server.dashboard.bind import parse_dashboard_address

        try:  # the port too, before any model is built or process started
            address = parse_dashboard_address(args.dashboard)
            check_port_free(address.host, address.port, "--dashboard")
        except ValueError as exc:
            problems.append(str(exc))
    try:
        outputs = demo_outputs(args.metrics_out, args.plot, args.state_dir)
    except ValueError as exc:
        problems.append(str(exc))
    if problems:
        for p in problems:
            print(f"hacfed demo: error: {p}", file=sys.stderr)
        return 2
    from hacfed.models.zoo import PRESETS

    unknown = [a for a in agents if a not in PRESETS]
    if unknown:
        print(f"hacfed demo: error: unknown preset(s) {unknown}; available: {', '.join(PRESETS)}", file=sys.stderr)
        return 2
    return run_demo(agents, args, outputs)


def demo_outputs(metrics: str | None, plot: str | None, state_dir: str | None) -> tuple[Path, Path, bool]:
    """Where this demo's metrics and plot go, and whether it resumes: a kept --state-dir that a demo
    ran in before names its files (the run goes on writing them); otherwise an earlier run's results
    are never overwritten: a path given that exists is refused, and the default names are numbered
    (runs/demo-2-metrics.jsonl, ...) until both are free."""
    record = Path(state_dir) / OUTPUTS_FILE if state_dir else None
    if record is not None and record.is_file():
        kept = json.loads(record.read_text(encoding="utf-8"))
        return Path(kept["metrics"]), Path(kept["plot"]), True
    for flag, given in (("--metrics-out", metrics), ("--plot", plot)):
        if given and Path(given).exists():
            raise ValueError(f"{flag} {given} exists (an earlier run's results); give a new path or move it away")
    for n in range(1, 10_000):
        suffix = "" if n == 1 else f"-{n}"
        out = Path(metrics or DEFAULT_METRICS.replace("demo-", f"demo{suffix}-"))
        png = Path(plot or DEFAULT_PLOT.replace("demo-", f"demo{suffix}-"))
        if not out.exists() and not png.exists():
            return out.resolve(), png.resolve(), False
    raise ValueError("runs/ holds 9999 earlier demo results; pass --metrics-out and --plot")


def participant_ids(agents: Sequence[str]) -> list[str]:
    ids: list[str] = []
    for i, name in enumerate(agents):
        ids.append(f"lab-{chr(ord('a') + i)}-{name.removeprefix('tiny-')}")
    return ids


def run_demo(agents: Sequence[str], args: Any, outputs: tuple[Path, Path, bool]) -> int:
    from hacfed.keys import ensure_key_pair
    from hacfed.models import store
    from hacfed.procs import ProcessSupervisor

    keep = args.state_dir is not None
    root = Path(args.state_dir) if keep else Path(tempfile.mkdtemp(prefix="hacfed-demo-"))
    root.mkdir(parents=True, exist_ok=True)
    metrics_out, plot_path, resumed = outputs
    metrics_out.parent.mkdir(parents=True, exist_ok=True)
    (root / OUTPUTS_FILE).write_text(json.dumps({"metrics": str(metrics_out), "plot": str(plot_path)}) + "\n",
                                     encoding="utf-8")
    if resumed:
        print(f"[demo] resuming the demo in {root}: its results go on in {metrics_out}")
    ids = participant_ids(agents)

    print(f"[demo] preparing {len(agents)} agents (copied or warmed up once, then cached in {store.models_root()})")
    for name in agents:
        prepare_agent(store, name)

    server_state = root / "coordinator"
    coordinator_keys = ensure_key_pair(server_state, "coordinator")
    server_tls, client_tls = provision_transport(root, server_state, ids, insecure=args.insecure)
    config = write_server_config(root / "coordinator.toml", args, len(ids), server_state)

    bindir = Path(sys.executable).parent
    # One torch thread per lab: several labs share the cores, and oversubscribed threads were
    # measured 3-15x slower on a 2-core machine.
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.setdefault("OMP_NUM_THREADS", "1")
    t0 = time.perf_counter()
    print(f"[demo] state in {root}; starting hacfed-server and {len(ids)} hacfed-client processes")
    try:
        with ProcessSupervisor(grace_s=10) as sup:
            server = sup.start(
                [str(bindir / "hacfed-server"), "--config", str(config), *server_tls, "--listen", "127.0.0.1:0",
                 "--metrics-out", str(metrics_out), *(["--dashboard", args.dashboard] if args.dashboard else [])],
                env=env, log_path=root / "server.log", name="hacfed-server",
            )
            address = _wait_ready(server, timeout_s=300)
            if address is not None:  # None: the run in this state dir was already complete
                print(f"[demo] coordinator listening on {address}")
                for pid, name in zip(ids, agents):
                    sup.start(
                        [str(bindir / "hacfed-client"), "--model", name, "--server", address, "--participant-id",
                         pid, "--state-dir", str(root / pid), "--coordinator-key", str(coordinator_keys.public),
                         *client_tls, "--lr", str(args.lr),
                         *(["--tensorboard", str(Path(args.tensorboard).resolve() / pid)] if args.tensorboard else [])],
                        env=env, log_path=root / f"{pid}.log", name=pid,
                    )
            code = _follow(server)
        if code != 0:
            print(f"[demo] hacfed-server exited with {code}; logs in {root}", file=sys.stderr)
            keep = True
            return 1
        rows = [json.loads(line) for line in metrics_out.read_text().splitlines() if line.strip()]
        print(f"[demo] {args.rounds} rounds in {time.perf_counter() - t0:.0f} s")
        print(accuracy_table(rows))
        plot_accuracy(rows, plot_path)
        if not keep:  # what the coordinator's last line named in it (its journal) goes with it
            shutil.rmtree(root, ignore_errors=True)
            print("[demo] removed the temporary state dir (journal, keys, logs); --state-dir DIR keeps them")
        print(f"[demo] results: metrics {metrics_out}, plot {plot_path}" + (f", state {root}" if keep else ""))
        return 0
    except KeyboardInterrupt:
        print("\n[demo] interrupted; every process was stopped", file=sys.stderr)
        return 130
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


def prepare_agent(store: Any, name: str) -> None:
    """Copy a shipped preset (hacfed.models.shipped), or build and warm up another, on first use (its
    bar, on a terminal, counts steps towards an estimate from the held-out checks:
    hacfed.models.warmup_estimate), then one "ready" line."""
    from hacfed.models import shipped, zoo

    before = store.read_metadata(store.model_dir(name, 0))
    if before is None and shipped.current_copy(name, 0, store.recipe_hash(zoo.preset_recipe(name, 0))) is None:
        print(f"[demo] {name}: building and warming up (first use; it stops when held-out accuracy reaches "
              f"{zoo.PRESETS[name].warmup.target_accuracy:.2f})", flush=True)
    path = store.ensure_built(name, 0, progress=sys.stderr.isatty())  # warm-up bars only on a terminal
    meta = store.read_metadata(path) or {}
    accuracy = meta.get("heldout_accuracy")
    shown = f"held-out accuracy {accuracy:.2f}" if isinstance(accuracy, (int, float)) else "built"
    if meta == before:
        print(f"[demo] {name} ready (cached): {shown}", flush=True)
    elif meta.get("shipped"):
        print(f"[demo] {name} ready (shipped with hacfed, no warm-up): {shown}", flush=True)
    else:
        print(f"[demo] {name} ready: {shown} after {meta.get('warmup_steps')} warm-up steps "
              f"({float(meta.get('warmup_seconds') or 0.0):.0f} s)", flush=True)


def provision_transport(root: Path, server_state: Path, ids: Sequence[str], *, insecure: bool
                        ) -> tuple[list[str], list[str]]:
    """What an operator and the labs do once (README "Running a real federation"), done in-process:
    each lab's keys and enrolment (`hacfed-client keys`), registered with the coordinator
    (`hacfed-server register`), and unless `insecure` a federation CA and a server certificate for
    127.0.0.1 (`hacfed-server certs init`). Returns the TLS flags of the server and of the clients."""
    from hacfed.certs import init_federation_certs
    from hacfed.clients.enrol import ensure_lab_keys
    from hacfed.enrolment import parse_enrolment
    from hacfed.server.registry import register

    keys_dir = server_state / "keys"
    keys_dir.mkdir(parents=True, exist_ok=True)
    for pid in ids:
        register(keys_dir, parse_enrolment(ensure_lab_keys(root / pid, pid).line))
    if insecure:
        print("[demo] --insecure: plaintext, no SuperNode authentication (development only)")
        return ["--insecure"], ["--insecure"]
    certs = root / "certs"
    paths = init_federation_certs(certs, []) if not (certs / "server.pem").exists() else None
    ca, cert, key = certs / "ca.pem", certs / "server.pem", certs / "server.key"
    print(f"[demo] TLS with SuperNode authentication: {'created' if paths else 'using'} the federation CA and "
          f"server certificate in {certs}; {len(ids)} labs registered")
    return ["--tls-cert", str(cert), "--tls-key", str(key), "--tls-ca", str(ca)], ["--tls-ca", str(ca)]


def write_server_config(path: Path, args: Any, n: int, state_dir: Path) -> Path:
    # The named mode's HacpoConfig settings (gspo2 also doubles G: hacfed.tools.modes).
    hacpo_table = "\n".join(f"{key} = {json.dumps(value)}" for key, value in get_mode(args.mode).settings.items())
    text = f"""run_id = "hacfed-demo"
rounds = {args.rounds}
prompts_per_round = {args.prompts_per_round}
group_size = {args.group_size * get_mode(args.mode).rollout_multiplier}
expected_participants = {n}
min_participants = {n}
round_deadline_s = 900.0
eval_every = {args.eval_every}
seed = {args.seed}
state_dir = "{state_dir}"

[task]
kind = "arithmetic"
digits = 2
operators = "+"

[sampling]
max_new_tokens = 6

[hacpo]
{hacpo_table}
"""
    path.write_text(text)
    return path


def _wait_ready(server: ManagedProcess, timeout_s: float) -> str | None:
    """The address in this start's ready line (a resumed demo's log also holds the earlier ones);
    None when hacfed-server found the run already complete and exited 0."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = _since_start(server)
        match = _READY.search(text)
        if match:
            return match.group(1)
        if not server.alive():
            if server.wait(timeout=30) == 0 and "already complete" in _since_start(server):
                return None
            raise RuntimeError(f"hacfed-server exited before it was ready:\n{text[-3000:]}")
        time.sleep(0.2)
    raise RuntimeError(f"hacfed-server not ready after {timeout_s:.0f} s; see {server.log_path}")


def _since_start(server: ManagedProcess) -> str:
    if not server.log_path.exists():
        return ""
    with open(server.log_path, "rb") as fh:
        fh.seek(server.log_offset)
        return fh.read().decode("utf-8", errors="replace")


def _follow(server: ManagedProcess) -> int:
    """Echo the coordinator's console from this start on (not a resumed run's earlier lines) while
    it runs; return its exit code."""
    log, position = server.log_path, server.log_offset
    while True:
        alive = server.alive()
        if log.exists():
            with open(log, errors="replace") as fh:
                fh.seek(position)
                chunk = fh.read()
                position = fh.tell()
            for line in chunk.splitlines():
                if line.strip():
                    print(f"  {line}", flush=True)
        if not alive:
            return server.wait(timeout=30)
        time.sleep(0.5)


def accuracy_table(rows: Sequence[dict]) -> str:
    agents = sorted({r["agent"] for r in rows})
    lines = [f"{'agent':<22} {'accuracy before':>15} {'accuracy after':>14} {'change':>7}"]
    for agent in agents:
        evals = sorted((r["round"], r["eval_accuracy"]) for r in rows
                       if r["agent"] == agent and r.get("eval_accuracy") is not None)
        if not evals:
            lines.append(f"{agent:<22} {'-':>15} {'-':>14} {'-':>7}")
            continue
        before, after = evals[0][1], evals[-1][1]
        lines.append(f"{agent:<22} {before:>15.3f} {after:>14.3f} {after - before:>+7.3f}")
    return "\n".join(lines)


def plot_accuracy(rows: Sequence[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 4))
    for agent in sorted({r["agent"] for r in rows}):
        points = sorted((r["round"], r["eval_accuracy"]) for r in rows
                        if r["agent"] == agent and r.get("eval_accuracy") is not None)
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=agent)
    ax.set_xlabel("round")
    ax.set_ylabel("held-out accuracy (greedy)")
    modes = sorted({str(r.get("mode", "")).upper() for r in rows if r.get("mode")})
    ax.set_title(f"hacfed demo: {'/'.join(modes) or 'HACPO'} across heterogeneous agents")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


