// A user header with the relative path of one of tapegrad's: including it from tapegrad is the bug this guards.
#error "tapegrad included the user's ops/matmul.hpp"
