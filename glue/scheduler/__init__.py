"""The scheduler: graph passes, fusion into kernels, kernel IR, memory planning -> Plan."""
