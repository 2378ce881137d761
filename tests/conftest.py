import os
import pathlib

import pytest

from tfdist.machine import facts

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The suite runs on CPU devices on every machine (logical CPUs, local clusters of several
# processes): this process and its children see no GPU. Tests marked `gpu` run where a GPU is,
# giving `GPUS` back to the processes they start (`gpu_env`).
GPUS = facts.visible_gpus()
os.environ["CUDA_VISIBLE_DEVICES"] = ""


def gpu_env() -> dict:
  """The environment that gives a started process this machine's GPUs."""
  return {"CUDA_VISIBLE_DEVICES": ",".join(GPUS)}


def pytest_configure(config):
  config.addinivalue_line("markers", "gpu: needs a GPU (run with -m gpu); skipped without one")


def pytest_collection_modifyitems(config, items):
  if GPUS:
    return
  skip = pytest.mark.skip(reason="no GPU on this machine")
  for item in items:
    if "gpu" in item.keywords:
      item.add_marker(skip)

REPO = pathlib.Path(__file__).resolve().parent.parent
CONFIGS = REPO / "configs"
PROGRAMS = REPO / "tests" / "programs"


@pytest.fixture(scope="session")
def two_cpus():
  """Splits this test process's CPU into 2 logical devices (once: TensorFlow allows no change)."""
  import tfdist
  from tfdist.config import DevicesConfig
  tfdist.configure_devices(DevicesConfig(logical_cpus=2))


@pytest.fixture
def write_config(tmp_path):
  def write(text: str, name: str = "config.yaml") -> pathlib.Path:
    path = tmp_path / name
    path.write_text(text)
    return path
  return write
