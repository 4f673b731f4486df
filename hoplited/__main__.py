from hoplited.main import main

main()
