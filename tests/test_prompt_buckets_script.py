"""The padding and shared-prefix arithmetic of experiments/benchmarks/prompt_buckets.py
on hand-computed cases."""
import benchmark_scripts

pb = benchmark_scripts.load('prompt_buckets')


def test_padding_per_row_and_per_call():
  a, b, c = (1,) * 300, (2,) * 500, (3,) * 600
  # Call 1: a and b (a twice: the repeat is prefilled once); call 2: c alone.
  calls = [[a, b, a], [c]]
  r = pb.padding_ratios(calls, (512, 1024))
  real = 300 + 500 + 300 + 600
  assert r['buckets'] == 2
  assert r['row'] == (512 + 512 + 512 + 1024) / real
  # Per call: the distinct prompts {a, b} padded to the bucket of b (512), c to 1024.
  assert r['call'] == (2 * 512 + 1024) / (300 + 500 + 600)


def test_common_prefix():
  assert pb.common_prefix((1, 2, 3), (1, 2, 4, 5)) == 2
  assert pb.common_prefix((1, 2), (1, 2, 3)) == 2
  assert pb.common_prefix((9,), (1,)) == 0


def test_chunked_calls():
  a, b, c = (1,) * 3, (2,) * 1, (3,) * 2
  calls = [[a, b, c]]
  assert pb.chunked_calls(calls, 2, False) == [[a, b], [c]]
  assert pb.chunked_calls(calls, 2, True) == [[b, c], [a]]
