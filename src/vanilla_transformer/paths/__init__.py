"""Paths checked before any work: input files (one line naming the problem), output files and folders written whole
or not at all, folders that do not exist (with the one most likely meant), full disks, and model folders whose
tokenizer must fit the model."""
