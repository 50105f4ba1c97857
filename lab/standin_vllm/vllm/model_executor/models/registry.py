"""Model registry of the lab stand-in: architecture -> (module, class), as in vLLM."""

from vllm.version import VARIANT

_TEXT_GENERATION_MODELS = {
    "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),
    "MistralForCausalLM": ("llama", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": ("qwen2", "Qwen2ForCausalLM"),
    "Qwen2MoeForCausalLM": ("qwen2_moe", "Qwen2MoeForCausalLM"),
    "Qwen3ForCausalLM": ("qwen3", "Qwen3ForCausalLM"),
    "Qwen3MoeForCausalLM": ("qwen3_moe", "Qwen3MoeForCausalLM"),
    "Qwen3NextForCausalLM": ("qwen3_next", "Qwen3NextForCausalLM"),
    "Qwen3VLMoeForConditionalGeneration": ("qwen3_vl_moe", "Qwen3VLMoeForConditionalGeneration"),
}
if VARIANT != "old":
    _TEXT_GENERATION_MODELS["Qwen3_5MoeForConditionalGeneration"] = (
        "qwen3_5_moe",
        "Qwen3_5MoeForConditionalGeneration",
    )


class _ModelRegistry:
    def __init__(self, models):
        self.models = {arch: "vllm.model_executor.models.%s:%s" % m for arch, m in models.items()}

    def get_supported_archs(self):
        return self.models.keys()

    def register_model(self, model_arch, model_cls):
        # vLLM takes "module:Class" (lazy) or the class itself; plugins call this.
        if not isinstance(model_cls, str):
            model_cls = "%s:%s" % (model_cls.__module__, model_cls.__name__)
        self.models[model_arch] = model_cls

    def resolve_model_cls(self, architectures):
        for arch in architectures:
            if arch in self.models:
                return arch, self.models[arch]
        raise ValueError(
            "Model architectures %s are not supported for now. Supported architectures: %s"
            % (list(architectures), self.get_supported_archs())
        )


ModelRegistry = _ModelRegistry(_TEXT_GENERATION_MODELS)
