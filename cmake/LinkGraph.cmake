# The library graph of this build, for the layering check (scripts/check_layering.py --links;
# CTest's layering.check_layering passes it): every target the project defines, the folder
# that defines it, and every entry of its LINK_LIBRARIES and INTERFACE_LINK_LIBRARIES, as
# tab-separated lines
#   target <name> <type> <folder relative to the source root>
#   link   <name> <linked item>
# dcf_write_link_graph runs last in the top-level CMakeLists.txt, when every target exists.

function(dcf_collect_targets dir out_var)
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(sub IN LISTS subdirs)
    dcf_collect_targets(${sub} sub_targets)
    list(APPEND targets ${sub_targets})
  endforeach()
  set(${out_var} ${targets} PARENT_SCOPE)
endfunction()

function(dcf_write_link_graph path)
  dcf_collect_targets(${CMAKE_SOURCE_DIR} targets)
  set(text "")
  foreach(t IN LISTS targets)
    get_target_property(type ${t} TYPE)
    if(type STREQUAL "UTILITY")
      continue()
    endif()
    get_target_property(dir ${t} SOURCE_DIR)
    file(RELATIVE_PATH rel ${CMAKE_SOURCE_DIR} ${dir})
    string(APPEND text "target\t${t}\t${type}\t${rel}\n")
    foreach(prop LINK_LIBRARIES INTERFACE_LINK_LIBRARIES)
      get_target_property(libs ${t} ${prop})
      if(libs)
        foreach(lib IN LISTS libs)
          string(APPEND text "link\t${t}\t${lib}\n")
        endforeach()
      endif()
    endforeach()
  endforeach()
  set(old "")
  if(EXISTS ${path})
    file(READ ${path} old)
  endif()
  if(NOT old STREQUAL text)  # unchanged: keep the timestamp
    file(WRITE ${path} "${text}")
  endif()
endfunction()
