/* tests/stub_missing_dep.c: a library the needs-missing stub links against, installed under a name that never exists. */
__attribute__((visibility("default"))) int kiln_test_missing_dep_value(void);
__attribute__((visibility("default"))) int kiln_test_missing_dep_value(void) { return 42; }
