// Moved to tests/testing/paths.h; kept for the tests that still include it here.
#pragma once

#include "tests/testing/paths.h"
