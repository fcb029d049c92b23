"""The SFT set: balanced memory-decision states with one correct target command each.

SPEC §4 and paper Appendix D.1–D.3. Eight targets (the seven tools and ∅) are exactly
balanced per split (paper: 4,000 train / 500 dev each; `SFTDataConfig` default is the
tiny scale). Each record pairs the policy input x_i = g(s_i) (`render_policy_input`)
with the target command text u*_i (`format_command`), and keeps its op, the template
that built the state, whether the state is a boundary/negative one, the example id,
the split and the source ('template' or 'teacher').

States come from boundary and standard templates (D.2; `templates`), every candidate
passes the seven deterministic filters of D.3 with no repair (`filters`), valid
records are deduplicated by (state, op, arguments), and an optional OpenAI-compatible
teacher may fill part of each class (`teacher`, off by default).

Modules (`envs.episodes` loads the pools this package draws from):
  config          SFTDataConfig (config section `sft`).
  records         SFTRecord, SFTBuildReport.
  templates       Template and the registry TEMPLATES (which op, boundary or not, which
                  phases), templates_for.
  template_kit    what the templates share (document caps, the state builder, pick).
  ltm_templates   Add / Update / Delete templates.
  stm_templates   Retrieve / SelectEpisode / Filter / Summarize templates.
  null_templates  ∅ templates.
  filters         FILTER_NAMES, check_candidate (the seven filters), dedupe_key.
  teacher         OpenAICompatibleTeacher, teacher_messages, TeacherError.
  build           build_sft_set (per-class quotas, filtering, dedupe, the count table).
"""
