"""tfdist's reduce-scatter (`tfdist.training.reduce_scatter`, from TensorFlow's CPU AllToAll)
against TensorFlow's own ring all-reduce of the same tensors, then sliced: bit for bit, on 2, 3
and 4 logical CPUs and across 2 worker processes, for lengths from 1 to 100,003 (values over six
orders of magnitude, where a sum's order shows)."""

import subprocess
import sys

import pytest

from tfdist.training.reduce_scatter import shard_size
from tfdist.testing import forked
from tests.conftest import REPO
from tests.launching import ENV


def _checked(output: str) -> list[str]:
  lines = [line.split("] ", 1)[-1] for line in output.splitlines() if "SIZE " in line]
  assert lines, output[-3000:]
  return lines


@pytest.mark.parametrize("replicas", [2, 3, 4])
def test_each_shard_is_the_ring_all_reduces_slice_bit_for_bit(replicas):
  done = forked.run([sys.executable, "-m", "tests.programs.reduce_scatter_check",
                     str(replicas)], env=ENV, cwd=REPO, timeout=240)
  assert done.returncode == 0, done.stderr[-3000:]
  lines = _checked(done.stdout)
  assert len(lines) == 4 and all("BITWISE True MAX_DIFF 0.0" in line for line in lines), lines


def test_across_two_worker_processes_too(tmp_path):
  config = tmp_path / "config.yaml"
  config.write_text("cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n")
  done = subprocess.run([sys.executable, "-m", "tfdist", "launch", str(config), "--logs",
                         str(tmp_path / "logs"), "--verbose", "--", sys.executable, "-m",
                         "tests.programs.reduce_scatter_check", "2"],
                        env=ENV, cwd=REPO, capture_output=True, text=True, timeout=240)
  assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
  lines = _checked(done.stdout)
  assert len(lines) == 8 and all("BITWISE True MAX_DIFF 0.0" in line for line in lines), lines


@pytest.mark.parametrize("elements,replicas,size", [
    (3000, 3, 1008),  # 1000 float32 end at 4000 bytes: the next 64-byte boundary is 4032.
    (3024, 3, 1024),  # 1008 end on a boundary: TensorFlow's ring still adds 64 bytes.
    (1, 2, 16),  # Under 64 bytes: one 64-byte chunk.
    (17, 4, 16),
])
def test_shards_are_cut_as_tensorflows_ring_cuts_its_chunks(elements, replicas, size):
  assert shard_size(elements, replicas) == size
