"""What the doctor, tune and the loader's auto mode share: this rank's share of the node (cores,
memory), the machine's load, the model of a loader pipeline, the way loaders are measured (moved
here from fastcollate.training), and the auto mode's decision (``num_workers="auto"``). Depends on
fastcollate.core and fastcollate.data only, so that the loader (fastcollate.loader) and the doctor
(fastcollate.training) can both use it."""
