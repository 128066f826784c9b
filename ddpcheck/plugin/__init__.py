"""The pytest plugin's machinery; ``ddpcheck.pytest_plugin`` holds the hooks and imports from here.

``marker`` reads ``@pytest.mark.ddp`` and the command line, ``ranks`` runs a test body in every rank
of a process group, ``failure`` turns a failed group into one readable pytest failure.
"""
