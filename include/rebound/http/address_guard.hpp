// Kept for code written before 0.2: the SSRF guard lives in rebound/delivery/address_guard.hpp.
#pragma once

#include "rebound/delivery/address_guard.hpp"
