import os
import pathlib

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

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
