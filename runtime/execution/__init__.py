"""Running a scheduled step on the device: inputs, the jitted step function, executables, the executor."""
