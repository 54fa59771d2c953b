"""Unit tests, one folder per part of delayq: tests/unit/<part>/ tests the package <part> (delayq/ for the root
package's modules, helm/ for the chart); the tests of the whole tree (structure, packaging) sit here.

No server is needed. The folders are packages so that pytest's default import mode names each test module by
its path (unit.proxy.test_expiry, ...): two parts may then hold test files of the same name.
"""
