# Fails when a doctest case name in REBOUND_TEST_DIR/test_*.cpp holds ',' or ';'.
# doctest's --test-case takes ',' as a separator (bookworm's doctest_discover_tests escapes it,
# but a name copied into a hand-run or CI filter is not), and CMake splits lists on ';': either
# silently runs nothing. Run at configure (include()) and again
# at build time (cmake -P, whenever a test source changes), so that a name added after the
# configure fails the build that compiles it, not only CI's fresh configure.
# A name is the string pieces after TEST_CASE( or TEST_CASE_TEMPLATE(, over as many lines as
# they take (';' is read as <semicolon> first, so that CMake does not split on it).
file(GLOB _rebound_test_sources ${REBOUND_TEST_DIR}/test_*.cpp)
foreach(_file IN LISTS _rebound_test_sources)
  file(READ ${_file} _text)
  string(REPLACE ";" "<semicolon>" _text "${_text}")
  string(REGEX MATCHALL "TEST_CASE[A-Z_]*\\([ \t\r\n]*\"[^\"]*\"([ \t\r\n]*\"[^\"]*\")*"
         _names "${_text}")
  foreach(_name IN LISTS _names)
    if(_name MATCHES "[,]|<semicolon>")
      message(FATAL_ERROR "${_file}: test case names must not contain ',' or ';': ${_name}")
    endif()
  endforeach()
endforeach()
