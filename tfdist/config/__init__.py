"""YAML → validated config → TF_CONFIG: everything known before TensorFlow starts.

Takes: a YAML file, a TF_CONFIG document, a dict, the environment (`TF_CONFIG`,
`TFDIST_CONFIG`) and `--task`.
Gives: a frozen `Config` (`schema.py`, every field's type and rule), the cross-section rules
(`rules.py`), the strategies declared once with what each supports (`strategies.py`), batch
sizes and replica counts (`batch.py`), each task's TF_CONFIG (`tf_config.py`), roles
(`roles.py`), the config reference (`reference.py`).
Never imports: TensorFlow, or any room above it (strategy, training, launch, cli).
"""

from tfdist.config.batch import BatchSizes, batch_sizes, replica_count
from tfdist.config.loader import (CONFIG_ENV, config_to_dict, load_config, make_options,
                                  parse_task_flag)
from tfdist.config.schema import (JOBS, CentralStorageOptions, CheckpointConfig,
                                  ClusterConfig, Config, DefaultOptions, DevicesConfig,
                                  MirroredOptions, MultiWorkerMirroredOptions, OneDeviceOptions,
                                  ParameterServerOptions, StrategyConfig, TaskConfig,
                                  TensorBoardConfig, TrainingConfig)
from tfdist.config.tf_config import (LOCALHOST, cluster_spec, tf_config_for, tf_config_json,
                                     with_local_addresses)
