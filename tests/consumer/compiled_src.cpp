// The one unit that defines what the headers only declare under DOORMAN_SEPARATE_COMPILATION.
#include <doorman/src.hpp>
