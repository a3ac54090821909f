// A project that uses an installed doorman through find_package(doorman).
#include <doorman/doorman.hpp>

#include <cstdio>

int main() {
  auto repo = doorman::resource_repository::parse(R"({"resources": [
    {"identifier_glob": "*", "capacity": 10,
     "algorithm": {"kind": "FAIR_SHARE", "lease_length": 60, "refresh_interval": 16,
                   "learning_mode_duration": 0}}]})");
  doorman::manual_clock clock;
  doorman::basic_engine<doorman::manual_clock> engine(repo);
  engine.set_mastership(true, std::nullopt, clock.now());
  auto r = engine.get_capacity({"consumer", {{"r", 0, 4, std::nullopt}}}, clock.now());
  if (!r || r.value().resources.at(0).gets.capacity != 4) {
    std::puts("unexpected grant");
    return 1;
  }
  std::puts("consumer: ok");
  return 0;
}
