"""The layout of a built model's directory that the cache (`hacfed.models.store`) and the shipped presets
(`hacfed.models.shipped`) share: beside the Hugging Face files, one JSON file of hacfed's own metadata
(the recipe hash, the warm-up's result)."""

METADATA_FILE = "hacfed_model.json"
