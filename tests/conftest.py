"""Every test process gets 4 logical CPUs before TensorFlow starts."""

from tfdist.testing import use_logical_cpus

use_logical_cpus(4)
