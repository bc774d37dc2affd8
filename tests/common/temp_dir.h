// TempDir and ReadAll now live in the shared test library (tests/testing/temp_dir.h);
// this header keeps the old include path working.
#pragma once

#include "tests/testing/temp_dir.h"
