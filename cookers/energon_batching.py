"""One hook into how energon batches a task encoder's samples, called when the dataset is built.

energon's `TaskEncoder.build_batch` receives the `batch_size` and `packing_buffer_size` given to
`get_train_dataset` and stacks the packing buffer and the batcher on the dataset. Our task encoders
batch their samples one way only (translation by length bucket, rollouts packed to `seq_length`, ...):
a wrong argument refused here is one error when the dataset is built, where in the loader energon would
log it for every sample or buffer and go on. A task encoder may also put its own stage in place of
energon's packing buffer.

    class MyTaskEncoder(BatchingHook, TaskEncoder[...]):
        def before_batching(self, dataset, *, batch_size, packing_buffer_size, worker_config):
            if batch_size is not None:
                raise ValueError("pass batch_size=None")
            return dataset, packing_buffer_size
"""

from __future__ import annotations

from megatron.energon.flavors.base_dataset import SavableDataset
from megatron.energon.worker import WorkerConfig


class BatchingHook:
    """A mixin, before `TaskEncoder` among the bases: `before_batching` sees energon's batching arguments
    and returns the dataset and packing buffer size energon then batches with."""

    def before_batching(
        self,
        dataset: SavableDataset,
        *,
        batch_size: int | None,
        packing_buffer_size: int | None,
        worker_config: WorkerConfig,
    ) -> tuple[SavableDataset, int | None]:
        """Raise ValueError to refuse the arguments; by default the dataset and buffer go on unchanged."""
        return dataset, packing_buffer_size

    def build_batch(
        self,
        dataset: SavableDataset,
        *,
        batch_size: int | None,
        batch_drop_last: bool = False,
        packing_buffer_size: int | None = None,
        worker_config: WorkerConfig,
    ) -> SavableDataset:
        dataset, packing_buffer_size = self.before_batching(
            dataset,
            batch_size=batch_size,
            packing_buffer_size=packing_buffer_size,
            worker_config=worker_config,
        )
        return super().build_batch(  # type: ignore[misc]  (the TaskEncoder after this mixin)
            dataset,
            batch_size=batch_size,
            batch_drop_last=batch_drop_last,
            packing_buffer_size=packing_buffer_size,
            worker_config=worker_config,
        )
