"""The tf.data service's roles as cluster roles (`cluster.dispatcher`, `cluster.data_worker`):
`tfdist launch` starts each with `tfdist data-service`, watches it, and restarts a data worker
alone at its address when it dies (a consumer waits for a dead worker's task for ever: measured,
BUILD_NOTES.md); a training script sends its dataset there with TensorFlow's own
`tf.data.experimental.service.distribute(..., service=tfdist.data_service_address())`.
"""

from tfdist.data_service.servers import (data_service_address, own_address,
                                         run_data_service_server, start_data_service_server)

__all__ = ["data_service_address", "own_address", "run_data_service_server",
           "start_data_service_server"]
