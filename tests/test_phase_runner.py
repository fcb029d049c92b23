"""Tests for vermem_jax.train.phase_runner: the schedule (the loop itself runs in
tests/test_sft.py and tests/test_rl_phase.py, with resume)."""
from vermem_jax.train import phase_runner


def test_itstime_every_and_last():
  due = [n for n in range(1, 11) if phase_runner.itstime(n, 4, 10)]
  assert due == [4, 8, 10]
  assert [n for n in range(1, 11) if phase_runner.itstime(n, 4, 10, last=False)] == [4, 8]
  assert [n for n in range(1, 6) if phase_runner.itstime(n, 0, 5)] == [5]
  assert not any(phase_runner.itstime(n, 0, 5, last=False) for n in range(1, 6))


def test_eval_due_adds_epoch_ends():
  loop = phase_runner.LoopSettings(save_every=100, log_every=1, max_to_keep=2)
  cfg = phase_runner.RunnerConfig(name='sft', total=12, eval_every=5,
                                  max_consecutive_skips=3, loop=loop, epoch_steps=3)
  # Every 5 steps, every 3 (epoch ends) and the last.
  assert [n for n in range(1, 13) if cfg.eval_due(n)] == [3, 5, 6, 9, 10, 12]
