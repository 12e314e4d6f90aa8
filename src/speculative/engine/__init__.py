"""The decoding engine: the byte-level GPT (``model``), plain, speculative and multi-draft decoding
(``decode``), draft-length policies (``policy``), transformers models in the engine (``hf``), the
checksummed model pair (``pair``), reference laws from full forwards (``evaluate``), and the
device-aware clocks decoding reads (``timing``).
"""
