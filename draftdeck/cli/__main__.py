from draftdeck.cli import main

main()
