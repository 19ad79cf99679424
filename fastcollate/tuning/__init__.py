"""What the doctor, tune and the loader's auto mode share: this rank's share of the node (cores,
memory), the machine's load, and (moved here from fastcollate.training) the model of a loader
pipeline and the way loaders are measured. Depends on fastcollate.core only, so that the loader
(fastcollate.loader) and the doctor (fastcollate.training) can both use it."""
