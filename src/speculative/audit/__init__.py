"""Audits against exact laws: a verification function (``core``, on the cases of ``battery``, reported by
``report``), wrong rules (``pitfalls``), whole engines (``engine_audit``, on the cases of ``engine_cases``:
this library's and transformers' engines in ``engines``, planted bugs in ``engine_gallery``), the serving
battery, axes and gallery (``serving``), what a seed promises (``seeds``), the doors to vLLM and
OpenAI-compatible servers (``doors``) and the runs audited through them (``serving_runs``), the vLLM plugin
(``vllm_plugin``), and serving records analysed again (``serving_record``).
"""
