# Run by `cmake --install`: installs deploy/systemd/ftd.service with ExecStart pointing at the
# installed ftd (the unit in the tree runs /opt/ftd/build/server/ftd), and the sysusers file.
# FTD_SOURCE_DIR and FTD_BINARY_DIR are set by the install(CODE) before this script.
file(READ "${FTD_SOURCE_DIR}/deploy/systemd/ftd.service" unit)
string(REPLACE "/opt/ftd/build/server/ftd" "${CMAKE_INSTALL_PREFIX}/bin/ftd" unit "${unit}")
file(WRITE "${FTD_BINARY_DIR}/install/ftd.service" "${unit}")
file(INSTALL DESTINATION "${CMAKE_INSTALL_PREFIX}/lib/systemd/system" TYPE FILE
     FILES "${FTD_BINARY_DIR}/install/ftd.service")
file(INSTALL DESTINATION "${CMAKE_INSTALL_PREFIX}/lib/sysusers.d" TYPE FILE
     FILES "${FTD_SOURCE_DIR}/deploy/systemd/ftd.sysusers.conf" RENAME ftd.conf)
