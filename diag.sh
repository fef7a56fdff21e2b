set -x
which -a g++ c++; g++ -v 2>&1 | tail -3; readlink -f $(which g++)
g++ -print-file-name=libstdc++.so; g++ -print-file-name=libstdc++.a; ls -la /opt/gcc/lib64 | grep -i stdc; file $(g++ -print-file-name=libstdc++.so)
cat $(g++ -print-file-name=libstdc++.so) 2>/dev/null | head -5 | cut -c1-200
g++ -dumpspecs | grep -n -i "as-needed\|static-libstdc\|lstdc" | head
echo 'int main(){}' > /tmp/t.cc; g++ /tmp/t.cc -o /tmp/t -Wl,--push-state,--no-as-needed,-lstdc++,--pop-state -Wl,--verbose 2>&1 | grep -i "stdc++" | head; readelf -d /tmp/t | grep NEEDED
g++ /tmp/t.cc -o /tmp/t2 -Wl,--push-state,--no-as-needed,-lstdc++,--pop-state -v 2>&1 | grep collect2 | tr ' ' '\n' | grep -n -E "as-needed|stdc|^-z|push|pop|static" 
