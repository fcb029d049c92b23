"""The pieces of `experiments/run.py`, the curriculum's command line.

- `config_argv`: `--config` name resolution and the `--config.<field>` flags, checked
  before absl parses them.
- `overrides`: which fields a command overrides, and a prerequisite phase's config with
  those overrides applied.
- `phase_plan`: which phases a command runs (SPEC §4 prerequisites) and the command that
  makes a missing one.
- `workdir_lock`: the per-phase exclusive lock on `<workdir>/<phase>/.lock`.
- `preflight`: checks that fail in seconds before any phase trains.
"""
