"""YAML → validated config → TF_CONFIG: everything known before TensorFlow starts."""

from tfdist.config.batch import BatchSizes, batch_sizes, replica_count
from tfdist.config.loader import (CONFIG_ENV, config_to_dict, load_config, make_options,
                                  parse_task_flag)
from tfdist.config.schema import (JOBS, STRATEGIES, CentralStorageOptions, CheckpointConfig,
                                  ClusterConfig, Config, DefaultOptions, DevicesConfig,
                                  MirroredOptions, MultiWorkerMirroredOptions, OneDeviceOptions,
                                  ParameterServerOptions, StrategyConfig, TaskConfig,
                                  TensorBoardConfig, TrainingConfig)
from tfdist.config.tf_config import (LOCALHOST, cluster_spec, tf_config_for, tf_config_json,
                                     with_local_addresses)
