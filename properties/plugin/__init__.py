"""The kit as a pytest plugin.

    kit.py     ``pytest properties/ --impl=NAME``: options, the implementation loaded before
               collection, families marked not applicable, the conformance summary and verdict
    served.py  the served families' options (--baseline, --served-*), the served Impl's clients
               and watchdogs, a dead server restarted between tests

properties/conftest.py loads kit.py for the tests under properties/; the root conftest.py
registers served.py for the whole session (its options must exist before collection).
"""
