"""What the director loads: the admission driver (``gridgate.admission: lsf_proxy``) and the LSF
backend (``gridgate.backends: lsf``) with its pilot tracking."""
