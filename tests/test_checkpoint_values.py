"""train/checkpoint_values.py: JSON conversion, template casts and error messages."""

import numpy as np
import pytest

from vermem_jax.train import checkpoint_values as cv


def test_to_json_converts_numpy_values_and_names_the_bad_path():
  value = {'a': np.float32(0.5), 'b': np.arange(3, dtype=np.int32), 'c': (1, 'x', None)}
  assert cv.to_json(value, 'meta') == {'a': 0.5, 'b': [0, 1, 2], 'c': [1, 'x', None]}
  with pytest.raises(cv.CheckpointError, match=r'meta\.d: JSON keys must be str, got 3'):
    cv.to_json({'d': {3: 1}}, 'meta')
  with pytest.raises(cv.CheckpointError, match=r'meta\[1\]: object is not JSON'):
    cv.to_json([1, object()], 'meta')


def test_like_template_restores_array_dtypes_and_tuples():
  template = {'mean': np.zeros(2, np.float32), 'count': np.int64(0), 'pair': (1, 2)}
  back = cv.like_template({'mean': [1.5, 2.0], 'count': 7, 'pair': [3, 4], 'new': 1},
                          template)
  assert back['mean'].dtype == np.float32 and back['mean'].tolist() == [1.5, 2.0]
  assert type(back['count']) is np.int64 and back['count'] == 7
  assert back['pair'] == (3, 4) and back['new'] == 1


def test_error_line_is_one_cut_line():
  e = ValueError('line one\n   line two ' + 'x' * 400)
  line = cv.error_line(e, limit=20)
  assert line == 'ValueError: line one line two xx …'  # 20 characters, then the mark


def test_no_restorable_error_hints_at_another_model_only_for_mismatches():
  shapes = ['step 2: ValueError: a is not compatible with the stored shape',
            'step 1: ValueError: tree structures do not match']
  msg = str(cv.no_restorable_error('/w/sft', shapes))
  assert msg.startswith('no restorable checkpoint in /w/sft:\n  step 2')
  assert 'written for another model' in msg and 'Nothing was deleted' in msg
  other = str(cv.no_restorable_error('/w/sft', ['step 2: OSError: gone']))
  assert 'another model' not in other and 'move /w/sft aside' in other
  assert str(cv.no_restorable_error('/w/sft', [])) == 'no restorable checkpoint in /w/sft'
