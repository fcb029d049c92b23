"""Tests for vermem_jax.rl.advantages against NumPy references and hand cases."""
import json
import math

import numpy as np
import pytest

from vermem_jax.rl import advantages as A
from vermem_jax.rl import running_stats

RTOL = 1e-5
CFG = A.AdvantageConfig()


# ----------------------------------------------------------------- independent references


def _ref_norm(x, mean, std, floor=0.01, eps=1e-6, clip=5.0):
  return float(np.clip((x - mean) / (max(std, floor) + eps), -clip, clip))


def _ref_group_adv(rewards, groups):
  out = []
  for i, r in enumerate(rewards):
    members = [rewards[j] for j in range(len(rewards)) if groups[j] == groups[i]]
    mu = sum(members) / len(members)
    sd = math.sqrt(sum((m - mu) ** 2 for m in members) / len(members))
    out.append(0.0 if max(members) == min(members) else _ref_norm(r, mu, sd))
  return np.array(out)


def _ref_ema(mean, var, batches, d):
  # One EMA step per update batch on the first and second moments (pure Python).
  s2 = var + mean * mean
  for xs in batches:
    if not len(xs):
      continue
    m1 = sum(xs) / len(xs)
    m2 = sum(x * x for x in xs) / len(xs)
    mean = d * mean + (1 - d) * m1
    s2 = d * s2 + (1 - d) * m2
  return mean, s2 - mean * mean


# ----------------------------------------------------------------- A^global


def test_group_advantages_match_reference_on_random_groups():
  rng = np.random.default_rng(0)
  for _ in range(10):
    groups = np.repeat(np.arange(4), 8)
    rng.shuffle(groups)
    r = rng.uniform(size=groups.size)
    r[groups == 2] = 0.25  # one all-equal group
    got = A.group_advantages(r, groups, CFG)
    np.testing.assert_allclose(got, _ref_group_adv(list(r), list(groups)), rtol=RTOL,
                               atol=1e-12)
    assert np.all(got[groups == 2] == 0.0)


def test_identical_rewards_give_zero_and_no_nan():
  for value in (0.0, 0.1, 1.0 / 3.0, 1.0):
    adv = A.group_advantages([value] * 8, [7] * 8, CFG)
    assert np.all(adv == 0.0) and not np.any(np.isnan(adv))
  assert A.group_advantages([0.4], [0], CFG)[0] == 0.0  # group of one


def test_near_identical_rewards_are_bounded_by_the_floor():
  r = np.array([0.35] * 7 + [0.3])
  adv = A.group_advantages(r, np.zeros(8, int), CFG)
  assert np.all(np.isfinite(adv))
  dev = np.abs(r - r.mean())
  assert np.all(np.abs(adv) <= dev / 0.01 + 1e-12)
  assert np.all(np.abs(adv) <= 5.0)
  np.testing.assert_allclose(adv, _ref_group_adv(list(r), [0] * 8), rtol=RTOL)
  # Tinier spread: σ below the floor, so the floor sets the scale.
  r2 = np.array([0.35] * 7 + [0.349])
  adv2 = A.group_advantages(r2, np.zeros(8, int), CFG)
  np.testing.assert_allclose(adv2, (r2 - r2.mean()) / (0.01 + 1e-6), rtol=RTOL)


def test_clip_at_five():
  r = np.array([0.0] * 99 + [1.0])
  adv = A.group_advantages(r, np.zeros(100, int), CFG)
  assert adv[-1] == 5.0  # unclipped (1 - .01)/.0995 ≈ 9.95


# ----------------------------------------------------------------- RunningStats


def test_running_stats_init_update_reference():
  rng = np.random.default_rng(1)
  init = rng.uniform(size=128)
  rs = running_stats.RunningStats(decay=0.99)
  rs.init_from({'Add': init})
  mean, std = rs.get('Add')
  assert mean == pytest.approx(init.mean(), rel=RTOL)
  assert std == pytest.approx(init.std(), rel=RTOL)
  assert rs.count('Add') == 128
  batches = [rng.uniform(size=n) for n in (37, 1, 8, 120, 3)]
  for i, xs in enumerate(batches):  # several updates, one EMA step each
    rs.update('Add', xs)
    ref_mean, ref_var = _ref_ema(init.mean(), init.var(), batches[:i + 1], 0.99)
    mean, std = rs.get('Add')
    assert mean == pytest.approx(ref_mean, rel=RTOL)
    assert std == pytest.approx(math.sqrt(ref_var), rel=RTOL)
  assert rs.count('Add') == 128 + 169
  # The dev initialization fades per update, not per sample: after 5 updates its
  # weight in the mean is 0.99**5, however many instances they held.
  w = 0.99 ** 5
  others = sum((1 - 0.99) * 0.99 ** (4 - i) * b.mean() for i, b in enumerate(batches))
  assert rs.get('Add')[0] == pytest.approx(w * init.mean() + others, rel=RTOL)
  assert not rs.is_initialized('Delete')
  rs.update('Delete', [])  # no scores: nothing to learn from
  assert rs.get('Delete') is None and rs.count('Delete') == 0


def test_a_type_without_statistics_gets_them_from_its_first_update():
  # Phase start: statistics for ∅ only (e.g. no dev transition of Retrieve was scored).
  rs = running_stats.RunningStats(decay=0.99)
  rs.init_from({'Null': [0.5, 1.0]})
  assert not rs.is_initialized('Retrieve')
  # Update 1: three scored Retrieves, fewer than local_min_count (8): no statistics to
  # normalize with, so A^local = 0; afterwards the type has the batch's moments.
  out = A.compute_advantages(
      group_ids=[0], trajectory_index=[0, 0, 0], ops=['Retrieve'] * 3,
      accepted=[True] * 3, costs=[0.0] * 3, r_local=[0.25, 0.75, 1.0], r_global=[0.5],
      config=CFG, running_stats=rs)
  assert out.local_ops['Retrieve'].source == 'none'
  np.testing.assert_array_equal(out.a_local, [0.0, 0.0, 0.0])
  # By hand, in twelfths: 3, 9, 12 -> mean 8/12; squared deviations 25 + 1 + 16 = 42
  # over 144, / 3 -> variance 14/144 = 7/72.
  mean, std = rs.get('Retrieve')
  assert mean == pytest.approx(2 / 3, rel=1e-12)
  assert std ** 2 == pytest.approx(7 / 72, rel=1e-12)
  assert rs.count('Retrieve') == 3
  assert rs.get('Null') == (0.75, 0.25)  # untouched: no ∅ in the update
  # Update 2: one Retrieve scored 0.5 is normalized with those statistics:
  # (0.5 - 2/3) / (sqrt(7/72) + 1e-6) = -0.16667 / 0.311806 = -0.534521; then one EMA
  # step:
  # μ = 0.99 * 2/3 + 0.01 * 0.5 = 0.665,
  # σ² = 0.99 * 7/72 + 0.99 * 0.01 * (0.5 - 2/3)² = 0.09625 + 0.000275 = 0.096525.
  out = A.compute_advantages(
      group_ids=[0], trajectory_index=[0], ops=['Retrieve'], accepted=[True],
      costs=[0.0], r_local=[0.5], r_global=[0.5], config=CFG, running_stats=rs)
  assert out.local_ops['Retrieve'].source == 'running'
  assert out.a_local[0] == pytest.approx(-(1 / 6) / (math.sqrt(7 / 72) + 1e-6),
                                         rel=1e-12)
  assert out.a_local[0] == pytest.approx(-0.534521, abs=1e-6)
  mean, std = rs.get('Retrieve')
  assert mean == pytest.approx(0.665, rel=1e-12)
  assert std ** 2 == pytest.approx(0.096525, rel=1e-12)
  assert rs.count('Retrieve') == 4


def test_running_stats_reset_serialize_and_errors():
  rs = running_stats.RunningStats()
  rs.init_from({'Null': [0.5, 0.75], 'Filter': [1.0]})
  state = json.loads(json.dumps(rs.to_dict()))
  back = running_stats.RunningStats.from_dict(state)
  assert back.get('Null') == rs.get('Null') and back.get('Filter') == rs.get('Filter')
  assert back.count('Null') == 2 and back.decay == 0.99
  rs.init_from({'Add': [0.1]})  # re-initialization (phase start) forgets other ops
  assert rs.get('Null') is None
  rs.reset()
  assert rs.get('Add') is None and rs.to_dict()['ops'] == {}
  with pytest.raises(ValueError, match="unknown operation type"):
    rs.init_from({'Write': [0.5]})
  with pytest.raises(ValueError, match="no scores"):
    rs.init_from({'Add': []})
  with pytest.raises(ValueError, match="malformed"):
    running_stats.RunningStats.from_dict({'ops': {}})
  with pytest.raises(ValueError, match="bad statistics"):
    running_stats.RunningStats.from_dict({'decay': 0.99,
                              'ops': {'Add': {'mean': 0.5, 'var': -1, 'count': 3}}})


# ----------------------------------------------------------------- A^local / A^hier


def _batch(rng, n_traj=16, groups=2):
  """Random update batch: per-trajectory rewards and per-decision records."""
  group_ids = np.repeat(np.arange(groups), n_traj // groups)
  r_global = rng.uniform(size=n_traj)
  r_task = rng.uniform(size=n_traj)
  per_traj = rng.integers(1, 6, size=n_traj)
  tidx = np.repeat(np.arange(n_traj), per_traj)
  n = tidx.size
  # Many Add/Null (batch stats), few Delete (running stats), no others.
  ops = list(rng.choice(['Add', 'Null', 'Add', 'Null', 'Delete'], size=n))
  dele = [i for i, o in enumerate(ops) if o == 'Delete']
  for i in dele[7:]:  # at most 7 Delete -> running statistics
    ops[i] = 'Add'
  accepted = rng.uniform(size=n) > 0.15
  r_local = rng.uniform(size=n)
  r_local[~accepted] = np.nan
  costs = np.where(accepted, 0.0, rng.choice([0.5, 1.0], size=n))
  return dict(group_ids=group_ids, trajectory_index=tidx, ops=ops, accepted=accepted,
              costs=costs, r_local=r_local, r_global=r_global, r_task=r_task)


def _ref_local(ops, r_local, accepted, running, min_count=8):
  n = len(ops)
  out = np.zeros(n)
  for op in set(ops):
    idx = [i for i in range(n) if ops[i] == op and accepted[i]
           and not math.isnan(r_local[i])]
    if not idx:
      continue
    vals = [r_local[i] for i in idx]
    if len(idx) >= min_count:
      mu = sum(vals) / len(vals)
      sd = math.sqrt(sum((v - mu) ** 2 for v in vals) / len(vals))
      for i in idx:
        out[i] = 0.0 if max(vals) == min(vals) else _ref_norm(r_local[i], mu, sd)
    elif op in running:
      mu, sd = running[op]
      for i in idx:
        out[i] = _ref_norm(r_local[i], mu, sd)
  return out


def test_full_mode_matches_reference_and_uses_running_stats_for_rare_ops():
  rng = np.random.default_rng(2)
  b = _batch(rng)
  n_delete = sum(1 for o, a in zip(b['ops'], b['accepted']) if o == 'Delete' and a)
  assert 1 <= n_delete <= 7
  rs = running_stats.RunningStats()
  init = {'Add': rng.uniform(size=128), 'Delete': rng.uniform(0.2, 0.6, size=128),
          'Null': rng.uniform(size=128)}
  rs.init_from(init)
  before = {op: rs.get(op) for op in init}
  out = A.compute_advantages(**b, config=CFG, running_stats=rs)
  ref_l = _ref_local(b['ops'], b['r_local'], b['accepted'], before)
  ref_g = _ref_group_adv(list(b['r_global']), list(b['group_ids']))
  np.testing.assert_allclose(out.a_local, ref_l, rtol=RTOL, atol=1e-12)
  np.testing.assert_allclose(out.traj_a_global, ref_g, rtol=RTOL, atol=1e-12)
  np.testing.assert_allclose(out.a_global, ref_g[b['trajectory_index']], rtol=RTOL,
                             atol=1e-12)
  np.testing.assert_allclose(out.a_hier, ref_l + ref_g[b['trajectory_index']]
                             - b['costs'], rtol=RTOL, atol=1e-12)
  assert out.local_ops['Delete'].source == 'running'
  assert out.local_ops['Delete'].count == n_delete
  assert out.local_ops['Add'].source == 'batch'
  assert out.metrics['advantage/local_Delete_uses_running'] == 1.0
  # Rejected commands: A^local = 0 but A^global and the cost still apply.
  rej = ~b['accepted']
  assert rej.any() and np.all(out.a_local[rej] == 0.0)
  np.testing.assert_allclose(out.a_hier[rej], out.a_global[rej] - b['costs'][rej])
  assert not np.any(np.isnan(out.a_hier))
  # Running statistics absorbed the batch AFTER use: one EMA step per type.
  for op in init:
    xs = [b['r_local'][i] for i in range(len(b['ops']))
          if b['ops'][i] == op and b['accepted'][i]]
    mu0, sd0 = before[op]
    ref_mean, ref_var = _ref_ema(mu0, sd0 ** 2, [xs], 0.99)
    mean, std = rs.get(op)
    assert mean == pytest.approx(ref_mean, rel=RTOL)
    assert std == pytest.approx(math.sqrt(ref_var), rel=RTOL)


def test_seven_instances_use_running_stats_eight_use_batch():
  rs = running_stats.RunningStats()
  rs.init_from({'Summarize': [0.4, 0.6]})  # μ 0.5, σ 0.1
  scores = np.linspace(0.0, 1.0, 8)
  for n, source in ((7, 'running'), (8, 'batch')):
    out = A.compute_advantages(
        group_ids=[0], trajectory_index=np.zeros(n, int), ops=['Summarize'] * n,
        accepted=np.ones(n, bool), costs=np.zeros(n), r_local=scores[:n],
        r_global=[0.5], config=CFG, running_stats=rs, update_running_stats=False)
    assert out.local_ops['Summarize'].source == source
    if source == 'running':
      np.testing.assert_allclose(
          out.a_local, np.clip((scores[:7] - 0.5) / (0.1 + 1e-6), -5, 5), rtol=RTOL)
    else:
      np.testing.assert_allclose(
          out.a_local, (scores - scores.mean()) / (scores.std() + 1e-6), rtol=RTOL)
  # local_min_count comes from the config.
  out = A.compute_advantages(
      group_ids=[0], trajectory_index=np.zeros(7, int), ops=['Summarize'] * 7,
      accepted=np.ones(7, bool), costs=np.zeros(7), r_local=scores[:7],
      r_global=[0.5], config=A.AdvantageConfig(local_min_count=7), running_stats=rs)
  assert out.local_ops['Summarize'].source == 'batch'


def test_uninitialized_rare_op_gets_zero_local_advantage():
  out = A.compute_advantages(
      group_ids=[0], trajectory_index=[0, 0], ops=['Retrieve', 'Retrieve'],
      accepted=[True, True], costs=[0.0, 0.0], r_local=[0.2, 0.9], r_global=[0.5],
      config=CFG, running_stats=running_stats.RunningStats())
  assert out.local_ops['Retrieve'].source == 'none'
  np.testing.assert_array_equal(out.a_local, [0.0, 0.0])


def _ref_mode(mode, b, before, lam):
  """The paper's ablation rows (Table 4 / Table 18 captions) from the references."""
  tidx = b['trajectory_index']
  a_task = _ref_group_adv(list(b['r_task']), list(b['group_ids']))[tidx]
  a_glob = _ref_group_adv(list(b['r_global']), list(b['group_ids']))[tidx]
  a_loc = _ref_local(b['ops'], b['r_local'], b['accepted'], before)
  l_l, l_g, l_c = lam
  c = np.asarray(b['costs'])
  return {'full': l_l * a_loc + l_g * a_glob - l_c * c,        # Local+Global
          'no_verify': l_g * a_task - l_c * c,                 # VerMem-noVerify
          'plus_local': l_g * a_task + l_l * a_loc - l_c * c,  # +Local
          'plus_global': l_g * a_glob - l_c * c}[mode]         # +Global


def _random_case(rng, seed):
  """A random batch (1-3 task groups), dev scores for Add / Delete / ∅ and (λ_l, λ_g,
  λ_c): all 1 for seed 0, random otherwise."""
  b = _batch(rng, n_traj=8 * (1 + seed % 3), groups=1 + seed % 3)
  rs_init = {'Add': rng.uniform(size=16), 'Delete': rng.uniform(size=16),
             'Null': rng.uniform(size=16)}
  lam = (1.0, 1.0, 1.0) if seed == 0 else tuple(rng.uniform(0.1, 3.0, size=3))
  return b, rs_init, lam


def test_every_mode_has_one_formula_in_the_table():
  assert tuple(A.MODE_FORMULAS) == A.MODES
  # Hand-computed: λ_l = 2, λ_g = 3, λ_c = 5 on A^local = 1, A^global = 10, A^task = 100,
  # c = 0.1 (Eq. 5 and the Table 4 rows).
  cfg = A.AdvantageConfig(lambda_local=2.0, lambda_global=3.0, lambda_constraint=5.0)
  got = {m: float(f(np.array([1.0]), np.array([10.0]), np.array([100.0]),
                    np.array([0.1]), cfg)[0]) for m, f in A.MODE_FORMULAS.items()}
  assert got == pytest.approx({'full': 2 + 30 - 0.5, 'no_verify': 300 - 0.5,
                               'plus_local': 300 + 2 - 0.5, 'plus_global': 30 - 0.5})


@pytest.mark.parametrize('mode', A.MODES)
def test_each_mode_matches_the_paper_definition_on_random_groups(mode):
  for seed in range(5):
    b, rs_init, lam = _random_case(np.random.default_rng(100 + seed), seed)
    rs = running_stats.RunningStats()
    rs.init_from(rs_init)
    before = {op: rs.get(op) for op in rs_init}
    cfg = A.AdvantageConfig(mode=mode, lambda_local=lam[0], lambda_global=lam[1],
                            lambda_constraint=lam[2])
    out = A.compute_advantages(**b, config=cfg, running_stats=rs)
    np.testing.assert_allclose(out.a_hier, _ref_mode(mode, b, before, lam), rtol=RTOL,
                               atol=1e-12)
    if mode in ('no_verify', 'plus_global'):
      assert np.all(out.a_local == 0.0)
      assert rs.get('Add') == before['Add']  # no local branch: stats untouched


def test_plus_local_is_no_verify_plus_a_local():
  rng = np.random.default_rng(3)
  b = _batch(rng)
  rs_init = {'Add': rng.uniform(size=16), 'Null': rng.uniform(size=16)}
  def run(mode):
    rs = running_stats.RunningStats()
    rs.init_from(rs_init)
    return A.compute_advantages(**b, config=A.AdvantageConfig(mode=mode),
                                running_stats=rs)
  full, nv, pl, pg = (run(m) for m in ('full', 'no_verify', 'plus_local', 'plus_global'))
  np.testing.assert_allclose(pl.a_hier, nv.a_hier + full.a_local, rtol=RTOL, atol=1e-12)
  np.testing.assert_allclose(pg.a_hier, full.a_hier - full.a_local, rtol=RTOL,
                             atol=1e-12)
  # no_verify needs neither verifier scores nor running statistics.
  nb = dict(b, r_global=None, r_local=np.full(len(b['ops']), np.nan))
  out = A.compute_advantages(**nb, config=A.AdvantageConfig(mode='no_verify'))
  np.testing.assert_allclose(out.a_hier, nv.a_hier)
  with pytest.raises(ValueError, match="requires r_task"):
    A.compute_advantages(**dict(b, r_task=None), config=A.AdvantageConfig(
        mode='plus_local'), running_stats=running_stats.RunningStats())


@pytest.mark.parametrize('old', ['local_only', 'global_only'])
def test_retired_mode_names_are_refused_naming_the_new_ones(old):
  with pytest.raises(ValueError) as e:
    A.AdvantageConfig(mode=old)
  msg = str(e.value)
  assert old in msg
  for new in A.MODES:
    assert new in msg


def test_bad_inputs_raise():
  good = dict(group_ids=[0], trajectory_index=[0], ops=['Add'], accepted=[True],
              costs=[0.0], r_local=[0.5], r_global=[0.5], running_stats=running_stats.RunningStats())
  A.compute_advantages(**good)
  with pytest.raises(ValueError, match="unknown operation type"):
    A.compute_advantages(**dict(good, ops=['add']))
  with pytest.raises(ValueError, match="trajectory_index"):
    A.compute_advantages(**dict(good, trajectory_index=[1]))
  with pytest.raises(ValueError, match="costs"):
    A.compute_advantages(**dict(good, costs=[2.0]))
  with pytest.raises(ValueError, match="requires r_global"):
    A.compute_advantages(**dict(good, r_global=None))
  with pytest.raises(ValueError, match="running_stats"):
    A.compute_advantages(**dict(good, running_stats=None))
  with pytest.raises(ValueError, match="r_local"):
    A.compute_advantages(**dict(good, r_local=[1.5]))
  with pytest.raises(ValueError, match="mode"):
    A.AdvantageConfig(mode='both')


def test_invalid_op_allowed_only_when_rejected():
  base = dict(group_ids=[0, 0], trajectory_index=[0, 1], ops=['Invalid', 'Add'],
              costs=[1.0, 0.0], r_local=[np.nan, 0.5], r_global=[0.2, 0.8],
              running_stats=running_stats.RunningStats())
  out = A.compute_advantages(**base, accepted=[False, True])
  assert out.a_local[0] == 0.0
  np.testing.assert_allclose(out.a_hier[0], out.a_global[0] - 1.0)
  with pytest.raises(ValueError, match="marked accepted"):
    A.compute_advantages(**base, accepted=[True, True])


# ----------------------------------------------------------------- rejection preference


def _ref_floor(a_hier, accepted, costs, lam_c):
  """Rejection floor 'below_executable', loop by loop: each rejected value becomes
  min(its value, lowest executable value - λ_c c); nothing changes without both."""
  out = [float(x) for x in a_hier]
  executable = [out[i] for i in range(len(out)) if accepted[i]]
  if not executable or all(accepted):
    return np.array(out)
  lowest = min(executable)
  for i in range(len(out)):
    if not accepted[i]:
      out[i] = min(out[i], lowest - lam_c * costs[i])
  return np.array(out)


def _ref_preference(a_hier, accepted):
  rej = [a for a, ok in zip(a_hier, accepted) if not ok]
  exe = [a for a, ok in zip(a_hier, accepted) if ok]
  rej_mean = sum(rej) / len(rej) if rej else math.nan
  exe_mean = sum(exe) / len(exe) if exe else math.nan
  share = (sum(1 for a in exe if a < rej_mean) / len(exe)) if rej and exe else math.nan
  return share, rej_mean, exe_mean


# One update by hand (ε = 0 so the z-scores are exact): trajectories 0 and 1 of one
# task with r^global 0.75 / 0.25 -> A^global +1 / -1; ∅ scored 1.0 and 0.5 (batch
# statistics from 2 instances: μ 0.75, σ 0.25) -> A^local +1 / -1; one Retrieve without
# statistics -> A^local 0; a Delete rejected for a missing id (c 0.5) and an
# unparseable command (c 1.0).
HAND = dict(group_ids=[0, 0], trajectory_index=[0, 1, 0, 1, 1],
            ops=['Null', 'Null', 'Delete', 'Invalid', 'Retrieve'],
            accepted=[True, True, False, False, True], costs=[0.0, 0.0, 0.5, 1.0, 0.0],
            r_local=[1.0, 0.5, np.nan, np.nan, 0.5], r_global=[0.75, 0.25])
HAND_CFG = dict(epsilon=0.0, local_min_count=2)
# Eq. 5: [1+1, -1-1, 0+1-0.5, 0-1-1, 0-1]. The rejected Delete (0.5) is above two of
# the three executable decisions; the rejected mean -0.75 is above -2 and -1.
HAND_EQ5 = np.array([2.0, -2.0, 0.5, -2.0, -1.0])
# Floor: lowest executable -2; Delete min(0.5, -2 - 0.5) = -2.5, Invalid min(-2, -3) = -3.
HAND_FLOORED = np.array([2.0, -2.0, -2.5, -3.0, -1.0])


def test_rejection_preference_hand_case():
  p = A.rejection_preference([1.0, -2.0, 0.5, -1.0], [True, True, False, True])
  assert p.rejected_mean == 0.5 and p.executable_mean == pytest.approx(-2 / 3)
  assert p.share == pytest.approx(2 / 3)  # -2 and -1 below 0.5, 1.0 is not
  # Ties are not "below"; empty sets give NaN.
  assert A.rejection_preference([-1.0, -1.0], [True, False]).share == 0.0
  for accepted in ([True, True], [False, False]):
    p = A.rejection_preference([0.3, -0.2], accepted)
    assert math.isnan(p.share)
  assert math.isnan(A.rejection_preference([0.3], [True]).rejected_mean)
  assert math.isnan(A.rejection_preference([0.3], [False]).executable_mean)
  with pytest.raises(ValueError, match='equal length'):
    A.rejection_preference([0.3, 0.1], [True])


def test_eq5_and_the_rejection_floor_on_a_hand_computed_update():
  eq5 = A.compute_advantages(**HAND, config=A.AdvantageConfig(**HAND_CFG),
                             running_stats=running_stats.RunningStats())
  np.testing.assert_allclose(eq5.a_hier, HAND_EQ5, rtol=0, atol=1e-12)
  m = eq5.metrics
  assert m['advantage/rejection_preference_share'] == pytest.approx(2 / 3)
  assert m['advantage/a_hier_rejected_mean'] == pytest.approx(-0.75)
  assert m['advantage/a_hier_executable_mean'] == pytest.approx(-1 / 3)
  assert m['advantage/num_rejections_floored'] == 0.0
  out = A.compute_advantages(
      **HAND, config=A.AdvantageConfig(**HAND_CFG, rejection_floor='below_executable'),
      running_stats=running_stats.RunningStats())
  np.testing.assert_allclose(out.a_hier, HAND_FLOORED, rtol=0, atol=1e-12)
  # Only A^hier moves: A^local, A^global and the costs stay Eq. 5's.
  np.testing.assert_array_equal(out.a_local, eq5.a_local)
  np.testing.assert_array_equal(out.a_global, eq5.a_global)
  m = out.metrics
  assert m['advantage/rejection_preference_share'] == 0.0
  assert m['advantage/a_hier_rejected_mean'] == pytest.approx(-2.75)
  assert m['advantage/a_hier_executable_mean'] == pytest.approx(-1 / 3)
  assert m['advantage/num_rejections_floored'] == 2.0


def test_rejection_floor_keeps_lower_values_and_an_all_rejected_update():
  # noVerify, r^task 1 / 0 -> A^task +1 / -1 (ε = 0). Eq. 5-style values: ∅ +1, a
  # rejected Filter (c 0.5) -1.5, an unparseable command (c 1) -2. The floor would be
  # 1 - 0.5 = 0.5 and 1 - 1 = 0: both rejections are already lower and stay.
  base = dict(group_ids=[0, 0], trajectory_index=[0, 1, 1],
              ops=['Null', 'Filter', 'Invalid'], costs=[0.0, 0.5, 1.0],
              r_local=[np.nan] * 3, r_task=[1.0, 0.0])
  cfg = A.AdvantageConfig(mode='no_verify', epsilon=0.0,
                          rejection_floor='below_executable')
  out = A.compute_advantages(**base, accepted=[True, False, False], config=cfg)
  np.testing.assert_allclose(out.a_hier, [1.0, -1.5, -2.0], rtol=0, atol=1e-12)
  assert out.metrics['advantage/num_rejections_floored'] == 0.0
  assert out.metrics['advantage/rejection_preference_share'] == 0.0
  # Every decision rejected: nothing to rank against, each keeps A^task - c
  # (∅ cannot be rejected; here a third rejected Filter stands in its place).
  out = A.compute_advantages(**dict(base, ops=['Filter', 'Filter', 'Invalid'],
                                    costs=[0.5, 0.5, 1.0]),
                             accepted=[False] * 3, config=cfg)
  np.testing.assert_allclose(out.a_hier, [0.5, -1.5, -2.0], rtol=0, atol=1e-12)
  m = out.metrics
  assert m['advantage/num_rejections_floored'] == 0.0
  assert m['advantage/a_hier_rejected_mean'] == pytest.approx(-1.0)
  # Undefined diagnostics are absent, not NaN (metrics.jsonl stays valid JSON).
  assert 'advantage/rejection_preference_share' not in m
  assert 'advantage/a_hier_executable_mean' not in m


@pytest.mark.parametrize('mode', A.MODES)
def test_rejection_floor_in_every_mode_matches_the_reference_and_zeroes_the_share(mode):
  for seed in range(5):
    b, rs_init, lam = _random_case(np.random.default_rng(200 + seed), seed)
    outs = {}
    for floor in A.REJECTION_FLOORS:
      rs = running_stats.RunningStats()
      rs.init_from(rs_init)
      before = {op: rs.get(op) for op in rs_init}
      cfg = A.AdvantageConfig(mode=mode, lambda_local=lam[0], lambda_global=lam[1],
                              lambda_constraint=lam[2], rejection_floor=floor)
      outs[floor] = A.compute_advantages(**b, config=cfg, running_stats=rs)
    eq5 = _ref_mode(mode, b, before, lam)
    np.testing.assert_allclose(outs['none'].a_hier, eq5, rtol=RTOL, atol=1e-12)
    floored = _ref_floor(eq5, b['accepted'], b['costs'], lam[2])
    out = outs['below_executable']
    np.testing.assert_allclose(out.a_hier, floored, rtol=RTOL, atol=1e-12)
    acc = b['accepted']
    assert (~acc).any() and acc.any()
    # Every rejection (cost 0.5 or 1 here) strictly below every executable command.
    assert out.a_hier[~acc].max() < out.a_hier[acc].min()
    assert out.metrics['advantage/rejection_preference_share'] == 0.0
    assert out.metrics['advantage/num_rejections_floored'] == float(
        np.sum(floored != eq5))
    for floor, o in outs.items():
      share, rej_mean, exe_mean = _ref_preference(list(o.a_hier), list(acc))
      m = o.metrics
      assert m['advantage/rejection_preference_share'] == pytest.approx(share)
      assert m['advantage/a_hier_rejected_mean'] == pytest.approx(rej_mean)
      assert m['advantage/a_hier_executable_mean'] == pytest.approx(exe_mean)


def test_rejection_floor_value_is_checked():
  with pytest.raises(ValueError, match="rejection_floor='always'.*'below_executable'"):
    A.AdvantageConfig(rejection_floor='always')
  assert A.AdvantageConfig().rejection_floor == 'none'  # the paper's Eq. 5
