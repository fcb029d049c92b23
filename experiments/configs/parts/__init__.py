"""The pieces `experiments/configs/common.py` assembles into a phase's ConfigDict.

One module per concern; a new field goes into the section builder of `paper.py` (with
its SPEC citation), a reduced size for the CPU default into `tiny.py`, its checks into
the section's `_check_*` function of `validation.py`.

- `curriculum`: the phase order, each phase's predecessor and op space, the scales.
- `paper`: SPEC's values, one builder per section.
- `tiny`: the reductions of the default CPU scale.
- `derived`: fields computed lazily from others (length buckets, tokenizer path).
- `validation`: `validate_config` and the tokenizer/model preflight check.
- `library`: the library's typed dataclasses and QwenConfig built from the sections.
"""
