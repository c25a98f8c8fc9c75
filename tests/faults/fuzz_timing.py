"""How long the fuzz target takes per input of a corpus (security.md S4: p99 of a rejection, inputs <= 1 MiB).

    python tests/faults/fuzz_decoders.py -max_total_time=60 CORPUS_DIR   # grow a corpus first
    python tests/faults/fuzz_timing.py CORPUS_DIR                          # then time each of its inputs

Each input of CORPUS_DIR up to `--max-bytes` (1 MiB) goes through `fuzz_decoders.test_one_input`
(every decoder and opener, and the coordinator's path behind a valid signature: open, decode,
validate) `--repeat` times; an input's time is the median of its runs. Prints the count, the median,
p99 and maximum, and the slowest inputs. hacfed's modules are imported before the fuzz target, so
they are timed as they run in the coordinator, without atheris's coverage instrumentation. This is
the decoding and validation a rejection costs; the coordinator's journal and audit commit of the
refusal come on top (tests/faults/test_hostile_corpus.py times those).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import hacfed.envelope  # noqa: F401 - imported before fuzz_decoders: not instrumented
import hacfed.exchange  # noqa: F401
import hacfed.server.coordinator.validation  # noqa: F401
import hacfed.wire  # noqa: F401

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzz_decoders  # noqa: E402


def time_corpus(directory: Path, max_bytes: int, repeat: int) -> list[tuple[float, str, int]]:
    """(seconds, name, size) per input, slowest first."""
    out = []
    for path in sorted(p for p in directory.iterdir() if p.is_file()):
        data = path.read_bytes()
        if len(data) > max_bytes:
            continue
        runs = []
        for _ in range(repeat):
            started = time.perf_counter()
            fuzz_decoders.test_one_input(data)
            runs.append(time.perf_counter() - started)
        out.append((statistics.median(runs), path.name, len(data)))
    return sorted(out, reverse=True)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus", type=Path)
    parser.add_argument("--max-bytes", type=int, default=1 << 20)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    if not args.corpus.is_dir():
        sys.exit(f"fuzz_timing: {args.corpus} is not a directory")
    times = time_corpus(args.corpus, args.max_bytes, args.repeat)
    if len(times) < 2:
        sys.exit(f"fuzz_timing: {args.corpus} holds fewer than 2 inputs of at most {args.max_bytes} bytes")
    seconds = sorted(t for t, _, _ in times)
    p99 = statistics.quantiles(seconds, n=100, method="inclusive")[98]
    print(f"{len(times)} inputs <= {args.max_bytes} B (largest {max(s for _, _, s in times)} B): "
          f"median {statistics.median(seconds) * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms, max {seconds[-1] * 1e3:.2f} ms")
    for t, name, size in times[:5]:
        print(f"  {t * 1e3:8.2f} ms  {size:>8d} B  {name}")


if __name__ == "__main__":
    main(sys.argv[1:])
