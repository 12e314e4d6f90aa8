"""Audits against exact laws: samplers and whole engines (``core``), wrong rules (``pitfalls``), the engine
battery and its gallery (``engines``), the serving battery, axes and gallery (``serving``), what a seed
promises (``seeds``), the doors to vLLM and OpenAI-compatible servers (``doors``), the vLLM plugin
(``vllm_plugin``), and serving records analysed again (``serving_record``).
"""
