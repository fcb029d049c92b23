"""Tests for experiments/benchmarks/bench_common.py: the CPU description printed next
to every speed ratio (model name and the bf16 flags)."""
import argparse

import pytest

import benchmark_scripts


@pytest.fixture(scope='module')
def bench_common():
  return benchmark_scripts.load('bench_common')


_TWO_CPUS = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse avx2 avx512f avx512bw amx_tile amx_bf16 amx_int8
processor\t: 1
model name\t: Other
flags\t\t: fpu avx512_bf16
"""


def test_first_cpu_model_and_its_bf16_flags(bench_common):
  assert (bench_common.cpu_description(_TWO_CPUS) ==
          'Intel(R) Xeon(R) Platinum 8480+ (avx512f yes, avx512_bf16 no, amx_bf16 yes)')


def test_missing_fields_read_unknown(bench_common):
  assert bench_common.cpu_description('') == 'unknown CPU (bf16 flags unknown)'
  assert (bench_common.cpu_description('model name : X\nflags : sse avx512_bf16\n')
          == 'X (avx512f no, avx512_bf16 yes, amx_bf16 no)')


def test_out_flag_refuses_a_path_it_cannot_write_when_parsing(bench_common, tmp_path,
                                                               capsys):
  parser = bench_common.add_out_flag(argparse.ArgumentParser())
  assert parser.parse_args([f'--out={tmp_path}/f.json']).out == f'{tmp_path}/f.json'
  for bad, message in ((f'{tmp_path}/missing/f.json', 'does not exist'),
                       (str(tmp_path), 'is not a file path')):
    with pytest.raises(SystemExit) as e:
      parser.parse_args([f'--out={bad}'])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert 'argument --out:' in err and message in err
