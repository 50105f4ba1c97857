"""Stand-in model class for Qwen3.5 MoE (the file the field's hybrid image copied in)."""


class Qwen3_5MoeForConditionalGeneration:
    """Lab stand-in: names the architecture; the workers produce the text."""

    architecture = "Qwen3_5MoeForConditionalGeneration"
