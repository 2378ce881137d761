"""`tfdist check` and the CLI's handling of bad commands and flags, run as a user runs them."""

import json
import re
import subprocess
import sys

import pytest

from tfdist.testing import forked
from tests.conftest import CONFIGS, REPO
from tests.launching import ENV


def tfdist(*args, env=None):
  return forked.run([sys.executable, "-m", "tfdist", *args], cwd=REPO, timeout=60, env=env)


def test_check_shows_each_tasks_tf_config_and_batch():
  result = tfdist("check", str(CONFIGS / "multi_worker_mirrored.yaml"), "--task", "worker:1")
  assert result.returncode == 0, result.stderr
  lines = result.stdout.splitlines()
  assert lines[0] == f"{CONFIGS / 'multi_worker_mirrored.yaml'}: valid"
  worker1 = next(line for line in lines if line.startswith("  worker:1: "))
  assert worker1.endswith("<- this process")
  document = json.loads(worker1[len("  worker:1: "):-len("  <- this process")])
  assert document["task"] == {"type": "worker", "index": 1}
  assert document["cluster"] == {"worker": ["127.0.0.1:<port>", "127.0.0.1:<port>"]}
  assert "strategy: multi_worker_mirrored, replicas in sync: 2 (0 GPU(s) per machine)" in lines
  assert "batch: global 64, per replica 32" in lines


@pytest.mark.parametrize("name", ["default.yaml", "mirrored.yaml", "central_storage.yaml",
                                  "parameter_server.yaml", "multi_worker_hosts.yaml",
                                  "tf_config.json"])
def test_check_accepts_every_example_config(name):
  result = tfdist("check", str(CONFIGS / name))
  assert result.returncode == 0, result.stderr
  assert result.stdout.startswith(f"{CONFIGS / name}: valid\n")


def test_check_reads_tf_config_from_the_environment():
  tf_config = {"cluster": {"chief": ["127.0.0.1:3001"], "worker": ["127.0.0.1:3002"]},
               "task": {"type": "worker", "index": 0}}
  result = tfdist("check", env={"PATH": "/usr/bin", "TF_CONFIG": json.dumps(tf_config)})
  assert result.returncode == 0, result.stderr
  assert "  worker:0: " + json.dumps(tf_config) + "  <- this process" in result.stdout


@pytest.mark.parametrize("args,message", [
    (["launch-everything"], "tfdist: the command must be one of check, launch, cluster-server, "
                            "data-service, export, tensorboard, env, estimate, model-server, "
                            "model-export. Received: 'launch-everything'"),
    (["check", "--no-such-flag"], "tfdist: Unknown command line flag 'no-such-flag'"),
    (["check", str(CONFIGS / "mirrored.yaml"), "--task", "boss:0"],
     "tfdist check: --task: must be TYPE:INDEX with TYPE one of chief, worker, ps, evaluator, "
     "dispatcher, data_worker. Received: 'boss:0'"),
])
def test_usage_mistakes_exit_2_with_one_line(args, message):
  result = tfdist(*args)
  assert result.returncode == 2
  assert result.stderr.splitlines()[0] == message


def test_importing_tfdist_and_the_launchers_event_writer_leaves_tensorflow_out(tmp_path):
  # A bad config is refused before TensorFlow loads, and the launcher never loads it: its
  # TensorBoard event writer uses TensorBoard's own TensorFlow-free stub.
  program = (
      "import sys, tfdist\n"
      "from tfdist.monitoring.launch_events import LaunchEvents\n"
      f"events = LaunchEvents({str(tmp_path)!r})\n"
      "events('worker-1 started')\n"
      "events.close()\n"
      "assert 'tensorflow' not in sys.modules and 'keras' not in sys.modules, 'loaded'\n"
      "print(tfdist.TrainingLoop.__name__)\n")  # Loaded when asked for.
  done = subprocess.run([sys.executable, "-c", program], cwd=REPO, env=ENV, capture_output=True,
                        text=True, timeout=120)
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.strip() == "TrainingLoop"
  assert list(tmp_path.iterdir())  # The event file was written.


def test_a_reader_that_stops_early_gets_no_traceback():
  """`tfdist check config.yaml | head -1`: the CLI's write to a closed pipe ends it quietly, with
  128 + SIGPIPE as a shell reports, not a BrokenPipeError traceback."""
  process = subprocess.Popen([sys.executable, "-m", "tfdist", "check",
                              str(CONFIGS / "multi_worker_mirrored.yaml")], env=ENV,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    process.stdout.close()  # Before the CLI writes: its first write finds the pipe closed.
    _, stderr = process.communicate(timeout=60)
  finally:
    process.kill()
  assert process.returncode == 141 and "Traceback" not in stderr, stderr[-2000:]


def _given(name: str) -> list[str]:
  """`--NAME` with a value of its type (a boolean takes none)."""
  from absl import flags
  from tfdist.cli.main import define_flags
  if "dry-run" not in flags.FLAGS:
    define_flags()
  flag = flags.FLAGS[name]
  if flag.boolean:
    return [f"--{name}"]
  value = {"int": "1", "float": "1"}.get(flag.parser.flag_type(), None)
  if value is None:
    value = getattr(flag.parser, "enum_values", None) and flag.parser.enum_values[0] or "x"
  return [f"--{name}={value}"]


def _foreign(command: str) -> str:
  """A flag of another command only, from the commands' own table."""
  from tfdist.cli.main import owners
  return next(name for name, commands in owners().items() if command not in commands)


@pytest.mark.parametrize("command", sorted(__import__("tfdist.cli.main", fromlist=["COMMANDS"])
                                           .COMMANDS))
def test_every_command_refuses_another_commands_flag_naming_it_with_exit_2(command):
  from tfdist.cli.main import owners
  name = _foreign(command)
  result = tfdist(command, *_given(name))
  assert result.returncode == 2, (result.stdout[-1000:], result.stderr[-2000:])
  owners_text = " and ".join(f"tfdist {c}" for c in owners()[name])
  assert result.stderr.strip().splitlines()[-1] == (
      f"tfdist {command}: --{name} is a flag of {owners_text}, not of tfdist {command} "
      f"(`tfdist {command} --help` lists its flags)")


def test_every_defined_flag_belongs_to_a_command_and_every_commands_flag_is_defined():
  from absl import flags
  from tfdist.cli.main import COMMAND_FLAGS, define_flags, owners
  if "dry-run" not in flags.FLAGS:
    define_flags()
  ours = {f.name for f in flags.FLAGS.get_flags_for_module("tfdist.cli.flags")}
  assert ours == set(owners()), ours ^ set(owners())
  assert all(names for names in COMMAND_FLAGS.values())


@pytest.mark.parametrize("command", ["launch", "export", "tensorboard", "estimate",
                                     "model-server", "model-export"])
def test_a_command_missing_its_arguments_exits_2_with_its_usage(command):
  result = tfdist(command)
  assert result.returncode == 2, result.stderr[-2000:]
  assert result.stderr.strip().splitlines()[-1].startswith(f"tfdist {command}: usage: tfdist "
                                                            f"{command} ")


def test_the_model_servers_old_name_flag_still_works_with_a_notice(tmp_path):
  result = tfdist("model-server", str(tmp_path / "missing.keras"), "--name", "m")
  assert result.returncode == 2  # The model is missing: the flag itself was taken.
  assert "tfdist model-server: --name is now spelled --model-name" in result.stderr
  both = tfdist("model-server", str(tmp_path / "missing.keras"), "--name", "m",
                "--model-name", "n")
  assert both.returncode == 2 and "--model-name: must be given alone" in both.stderr


# -- each command's own flags: one declaration, one meaning, one usage -----------------------

@pytest.mark.parametrize("command", sorted(__import__("tfdist.cli.main", fromlist=["COMMANDS"])
                                           .COMMANDS))
def test_each_commands_usage_and_help_list_exactly_the_flags_it_declares(command):
  from tfdist.cli.main import COMMANDS
  module = COMMANDS[command]
  declared = [flag.name for flag in module.FLAGS_DECLARED]
  assert len(declared) == len(set(declared)), declared
  in_usage = re.findall(r"(\[)?--([a-z][a-z-]*)", module.USAGE)
  assert [name for _, name in in_usage] == declared, module.USAGE
  required = {flag.name for flag in module.FLAGS_DECLARED if flag.required}
  assert {name for bracket, name in in_usage if not bracket} == required, module.USAGE
  help_text = tfdist(command, "--help").stdout
  listed = re.findall(r"^  --([a-z][a-z-]*)\b.*\(default: ", help_text, flags=re.M)
  assert listed == declared + list(getattr(module, "OLD_SPELLINGS", {})), help_text


def test_a_flag_name_has_one_meaning_across_commands():
  from tfdist.cli.main import COMMANDS
  meanings = {}
  for command, module in COMMANDS.items():
    for flag in module.FLAGS_DECLARED:
      meanings.setdefault(flag.name, set()).add(flag)
  assert {name: len(flags) for name, flags in meanings.items() if len(flags) > 1} == {}
  for command, module in COMMANDS.items():  # An old spelling: another command's flag's name.
    for old, new in getattr(module, "OLD_SPELLINGS", {}).items():
      assert old in meanings and old not in {f.name for f in module.FLAGS_DECLARED}, old
      assert new in {f.name for f in module.FLAGS_DECLARED}, (command, new)


def test_two_declarations_of_one_name_are_refused_naming_both_commands():
  from tfdist.cli import flags as cli_flags
  http = cli_flags.Flag("a-port-for-this-test", "integer", None, "HTTP's.")
  task = cli_flags.Flag("a-port-for-this-test", "integer", None, "The tasks' servers'.")
  with pytest.raises(ValueError, match="--a-port-for-this-test is declared twice with two "
                     "meanings: by tfdist serve and tfdist run"):
    cli_flags.define({"serve": (http,), "run": (task,)})


def test_launch_offers_the_backends_there_are_and_refuses_another_in_one_line():
  from tfdist.launch import backends
  result = tfdist("launch", str(CONFIGS / "default.yaml"), "--backend", "kube", "--", "true")
  assert result.returncode == 2
  (line,) = result.stderr.strip().splitlines()
  assert line.startswith("tfdist: flag --backend=kube: value should be one of <")
  offered = line.split("<", 1)[1].split(">", 1)[0].split("|")
  assert offered == list(backends.NAMES)
  for name in offered:  # Each offered one is a backend the launcher can load.
    assert backends.get(name).__name__ == f"tfdist.launch.backends.{name}"


_SERVER_START = """
import sys
import portpicker
from tfdist.cli import cluster_server
cluster_server.import_tensorflow_without_keras()
import tensorflow as tf
print(sorted(m for m in ("keras", "sklearn", "IPython") if m in sys.modules))
address = f"127.0.0.1:{portpicker.pick_unused_port()}"
server = tf.distribute.Server(tf.train.ClusterSpec({"ps": [address]}), "ps", 0, start=True)
print(server.target == "grpc://" + address)
import keras  # Still importable afterwards.
print(keras.optimizers.Adam.__name__)
"""


def test_a_cluster_server_starts_tensorflow_without_the_keras_it_imports_eagerly():
  """`tfdist cluster-server` skips the Keras that `import tensorflow` loads eagerly
  (tensorflow/__init__.py, b/196254385); its server still starts and Keras still imports. When
  plain TensorFlow stops importing Keras, the first assert says the workaround can go."""
  plain = subprocess.run([sys.executable, "-c", "import sys, tensorflow; print('keras' in "
                          "sys.modules)"], capture_output=True, text=True, timeout=120, env=ENV)
  assert plain.stdout.strip() == "True", "TensorFlow no longer imports Keras eagerly: drop " \
      "cluster_server.import_tensorflow_without_keras"
  done = subprocess.run([sys.executable, "-c", _SERVER_START], capture_output=True, text=True,
                        timeout=120, env=ENV, cwd=REPO)
  assert done.stdout.split() == ["[]", "True", "Adam"], done.stderr[-2000:]
