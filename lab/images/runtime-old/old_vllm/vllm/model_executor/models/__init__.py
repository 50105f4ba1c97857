"""The Qwen-family part of vLLM 0.11's registry (vllm/model_executor/models/registry.py): no Qwen3.5."""

_MODELS = {
    "Qwen2ForCausalLM": "qwen2:Qwen2ForCausalLM",
    "Qwen2MoeForCausalLM": "qwen2_moe:Qwen2MoeForCausalLM",
    "Qwen3ForCausalLM": "qwen3:Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM": "qwen3_moe:Qwen3MoeForCausalLM",
    "Qwen3NextForCausalLM": "qwen3_next:Qwen3NextForCausalLM",
    "Qwen3VLMoeForConditionalGeneration": "qwen3_vl_moe:Qwen3VLMoeForConditionalGeneration",
}


class _ModelRegistry:
    def get_supported_archs(self):
        return _MODELS.keys()


ModelRegistry = _ModelRegistry()
