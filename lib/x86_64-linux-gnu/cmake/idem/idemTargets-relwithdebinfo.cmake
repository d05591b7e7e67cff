#----------------------------------------------------------------
# Generated CMake target import file for configuration "RelWithDebInfo".
#----------------------------------------------------------------

# Commands may need to know the format version.
set(CMAKE_IMPORT_FILE_VERSION 1)

# Import target "idem::idem" for configuration "RelWithDebInfo"
set_property(TARGET idem::idem APPEND PROPERTY IMPORTED_CONFIGURATIONS RELWITHDEBINFO)
set_target_properties(idem::idem PROPERTIES
  IMPORTED_LOCATION_RELWITHDEBINFO "/work/main/lib/x86_64-linux-gnu/libidem.so.0.1.0"
  IMPORTED_SONAME_RELWITHDEBINFO "libidem.so.0"
  )

list(APPEND _cmake_import_check_targets idem::idem )
list(APPEND _cmake_import_check_files_for_idem::idem "/work/main/lib/x86_64-linux-gnu/libidem.so.0.1.0" )

# Commands beyond this point should not need to know the version.
set(CMAKE_IMPORT_FILE_VERSION)
