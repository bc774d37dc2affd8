// TempDir and ReadAll now live in the shared test library (tests/testing/temp_dir.h);
// this header keeps the old include path, and the standard headers it used to bring in
// (tests written against it use std::filesystem and std::ofstream through it).
#pragma once

#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/testing/temp_dir.h"
