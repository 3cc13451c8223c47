// See ../../README.md: named by ProcessGroupGloo.hpp, which uses nothing it declares.
#pragma once
