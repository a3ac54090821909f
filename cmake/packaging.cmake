# Debian packages with CPack (docs/deployment.md): `make package` or, in a configured build,
# `cpack -G DEB`.
#   doorman      the tools (doorman-node, doorman, doorman-sim, doorman-rls when built), the
#                systemd unit, /etc/doorman's defaults and the docs a deployment needs
#   doorman-dev  the headers and the CMake package (find_package(doorman))
# The unit and /etc/doorman are the component "system", left out of `cmake --install` (they
# would write outside the prefix) and put in the package only.

install(FILES deploy/systemd/doorman-node.service
  DESTINATION lib/systemd/system COMPONENT system EXCLUDE_FROM_ALL)
install(FILES deploy/systemd/doorman-node.env deploy/systemd/resources.yaml
  DESTINATION /etc/doorman COMPONENT system EXCLUDE_FROM_ALL)
install(FILES README.md docs/deployment.md docs/node.md docs/operations.md docs/configuration.md
  DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT system EXCLUDE_FROM_ALL)
install(DIRECTORY deploy/prometheus DESTINATION ${CMAKE_INSTALL_DOCDIR}
  COMPONENT system EXCLUDE_FROM_ALL)

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME doorman)
set(CPACK_PACKAGE_VENDOR "doorman")
set(CPACK_PACKAGE_CONTACT "doorman maintainers <doorman@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "global distributed client-side rate limiting (doorman)")
set(CPACK_PACKAGE_VERSION "${PROJECT_VERSION}")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_PACKAGE_DIRECTORY "${PROJECT_BINARY_DIR}/packages")
set(CPACK_OUTPUT_FILE_PREFIX "")

set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL tools system dev)
set(CPACK_COMPONENT_SYSTEM_GROUP runtime)
set(CPACK_COMPONENT_TOOLS_GROUP runtime)
set(CPACK_COMPONENT_DEV_GROUP dev)
set(CPACK_COMPONENTS_GROUPING ONE_PER_GROUP)

set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME doorman)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_DEPENDS "adduser")
# The synopsis is the summary above; CPack indents these lines below it.
set(CPACK_DEBIAN_RUNTIME_DESCRIPTION
  "doorman-node serves one position of a capacity tree: clients ask it for a share
of a resource's capacity and get a time-bounded lease. With its systemd unit
(doorman-node.service, reading /etc/doorman), the command-line tool doorman,
the simulator doorman-sim and, in a build with gRPC, Envoy's rate limit
service doorman-rls.")
set(CPACK_DEBIAN_RUNTIME_PACKAGE_CONTROL_EXTRA
  "${PROJECT_SOURCE_DIR}/deploy/debian/conffiles;${PROJECT_SOURCE_DIR}/deploy/debian/postinst;${PROJECT_SOURCE_DIR}/deploy/debian/prerm;${PROJECT_SOURCE_DIR}/deploy/debian/postrm")
set(CPACK_DEBIAN_RUNTIME_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_DEBIAN_DEV_PACKAGE_NAME doorman-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_ARCHITECTURE all)
set(CPACK_DEBIAN_DEV_PACKAGE_SHLIBDEPS OFF)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "libasio-dev, nlohmann-json3-dev, libfmt-dev")
set(CPACK_DEBIAN_DEV_DESCRIPTION
  "The header-only C++20 library (engine, node, client, limiters) and its CMake
package: find_package(doorman), then link doorman::doorman.")

include(CPack)
